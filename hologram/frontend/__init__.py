"""The tensor front end: :mod:`.graph` (tensor programs that build Atlas programs, one
kernel per op, views for free), :mod:`.functional` (composite functions on them:
activations, softmax, losses) and :mod:`.grad` (their reverse-mode derivatives, on the
same graph)."""
