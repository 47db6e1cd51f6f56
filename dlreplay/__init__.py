"""dlreplay: trace-driven capture, distillation, replay and analysis of deep-learning I/O.

Stages live in subpackages: :mod:`dlreplay.capture`, :mod:`dlreplay.analyze`,
:mod:`dlreplay.replay`. This core package (errors, event schema) imports none of them.
"""

__version__ = "0.1.0"
