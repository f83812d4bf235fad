"""Complex results on the hologram device equal the CPU's: FFTs (which return lazily
conjugated views), conjugate and negative views (``z.conj()``, ``z.conj().imag``) read,
copied, cloned, and written through; complex arithmetic through the fallback."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402,F401

torch.manual_seed(0)
REAL = torch.randn(8)
COMPLEX = torch.randn(8, dtype=torch.complex64)
GRID = torch.randn(4, 6)
CUBE = torch.randn(3, 4, 5)

CASES = {
    "fft": (torch.fft.fft, REAL),
    "ifft": (torch.fft.ifft, REAL),
    "ifft_complex": (torch.fft.ifft, COMPLEX),
    "ihfft": (torch.fft.ihfft, REAL),
    "hfft": (torch.fft.hfft, COMPLEX),
    "hfft2": (torch.fft.hfft2, GRID.to(torch.complex64)),
    "ihfft2": (torch.fft.ihfft2, GRID),
    "ihfftn": (torch.fft.ihfftn, CUBE),
    "hfftn": (torch.fft.hfftn, CUBE.to(torch.complex64)),
    "rfft": (torch.fft.rfft, REAL),
    "irfftn": (torch.fft.irfftn, CUBE.to(torch.complex64)),
    "stft": (lambda t: torch.stft(t, 4, window=torch.ones(4, device=t.device),
                                  return_complex=True), torch.randn(32)),
    "conj": (torch.conj, COMPLEX),
    "conj_imag": (lambda z: z.conj().imag, COMPLEX),
    "conj_imag_plus_one": (lambda z: z.conj().imag + 1, COMPLEX),
    "conj_imag_clone": (lambda z: z.conj().imag.clone(), COMPLEX),
    "conj_times_two": (lambda z: z.conj() * 2, COMPLEX),
    "product": (lambda z: z * z.conj(), COMPLEX),
    "conj_matmul": (lambda z: z.reshape(2, 4).conj() @ z.reshape(4, 2), COMPLEX),
    "vdot_conj": (lambda z: torch.vdot(z.conj(), z), COMPLEX),
    "abs_angle": (lambda z: z.conj().abs() + z.conj().angle(), COMPLEX),
    "item": (lambda z: torch.tensor(z.conj()[1].item()), COMPLEX),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_cpu(name):
    fn, x = CASES[name]
    ref = fn(x)
    got = fn(x.to("hologram"))
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref.resolve_conj().resolve_neg(), rtol=1e-5,
                               atol=1e-5)


WRITES = {
    "fill_conj": lambda z: z.conj().fill_(5 + 7j),
    "zero_neg": lambda z: z.conj().imag.zero_(),
    "add_neg": lambda z: z.conj().imag.add_(1),
    "mul_conj": lambda z: z.conj().mul_(2j),
    "copy_conj": lambda z: z.conj().copy_(COMPLEX.to(z.device).flip(0)),
    "copy_conj_from_cpu": lambda z: z.conj().copy_(COMPLEX.flip(0)),
    "copy_neg_broadcast": lambda z: z.conj().imag.copy_(torch.tensor(3.0)),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_through_lazy_views_match_cpu(name):
    ref = COMPLEX.clone()
    WRITES[name](ref)
    got = COMPLEX.to("hologram")
    WRITES[name](got)
    torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)


def test_device_to_device_copy_of_a_conjugate_resolves_it():
    z = COMPLEX.to("hologram")
    out = torch.empty_like(z)
    out.copy_(z.conj())
    assert not out.is_conj()
    torch.testing.assert_close(out.cpu(), COMPLEX.conj().resolve_conj(), rtol=0, atol=0)
    x = torch.empty(8, device="hologram")
    x.copy_(z.conj().imag)  # a negative view into a real tensor
    torch.testing.assert_close(x.cpu(), -COMPLEX.imag, rtol=0, atol=0)
