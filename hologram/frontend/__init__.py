"""The tensor front end: :mod:`.graph` (tensor programs that build Atlas programs, one
kernel per op, views for free) and :mod:`.functional` (composite functions on them:
activations, softmax, losses)."""
