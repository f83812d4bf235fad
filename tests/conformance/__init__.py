"""The backend-conformance suite: every backend in :func:`hologram.backends.available`
against the reference interpreter (the ISA's definition), on every (op, dtype) pair it
declares (:meth:`hologram.backends.base.Backend.supports`). A new backend joins by being
registered; the interpreter joins too, as a self-check of the suite. See numerics.py for
the tolerances."""
