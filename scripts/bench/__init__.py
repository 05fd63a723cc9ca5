"""``make bench``: what the two fixes cost and save, base and patched side by side, and the gate against its floor.

``python -m scripts.bench`` (``__main__.py``) runs the parts; ``common.py`` holds the base and patched sides and
the measurement processes, each a ``child.py`` run by the venv's Python; ``upstreams.py`` measures Accelerate's
``prepare()`` and epochs and DeepSpeed's sampler, ``gate.py`` the gate against its floor F, where the gate's time goes
and a cold ``make apply``.
"""
