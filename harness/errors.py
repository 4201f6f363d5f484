"""The one exception family for bad input: what the user handed over is wrong, and can be fixed.

Every validator in the project raises one of these, before any work is done; the message names the
value and what was expected. The CLI turns exactly these (and ``OSError``) into one line and exit
code 2; any other exception is a bug of ours: a traceback, exit code 1 and a line on how to report it.

- :class:`AttnlabError` (a ``ValueError``): a value is wrong (a token id outside the vocabulary, an
  unknown task, a mask of the wrong shape, a corrupt checkpoint, a diverged training run's settings).
- :class:`AttnlabTypeError` (also a ``TypeError``): a value is of the wrong kind, e.g. a model that
  does not follow the model protocol, or a path that is not a path.
"""

from __future__ import annotations


class AttnlabError(ValueError):
    """Bad input: the message names the value and what was expected."""


class AttnlabTypeError(AttnlabError, TypeError):
    """Bad input of the wrong kind (also a ``TypeError``, so ``except TypeError`` still catches it)."""
