"""The device-neutral lowering between the scheduled Atlas program and the renderers
(:mod:`hologram.codegen.loops`): what every backend decides the same way before it emits
code for its device."""
