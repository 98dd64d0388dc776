"""EAGLE-style feature heads: the module, its artifact and speculators loaders, the drafter.

``head`` holds ``EagleHead`` (fusion fc over [token embedding, target feature], one Llama
decoder layer, the target's frozen final norm and LM head, optionally cut to a frequency-ranked
subset of rows; optionally fusing several target layers' states first, EAGLE-3 style, the
layers chosen and checked in ``layers``); ``artifact`` saves and loads it in this project's
layout and, through ``speculators``, published heads in that project's layout (EAGLE-1 and
EAGLE-3, whose decoder layer ``head`` also holds); ``step`` runs it one block at a
time over its own small KV cache; ``drafter`` is the stateful proposer a round loop drives
(begin / propose / accept); ``trace`` records a head's greedy trace for replay.
"""
