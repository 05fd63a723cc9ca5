"""The history search: generated sequences of a training job's operations, run on the release and on the series beside
the uninterrupted job, judged after every step, a failure shrunk and stored as a flow.

``search.py`` draws and shrinks histories (Hypothesis' stateful testing), ``history.py`` runs one on both sides,
``servers.py`` keeps the job servers (``tests/histories/<upstream>_job.py``) alive across histories, ``judge.py``
judges a record and ``stored.py`` keeps what was found (``tests/histories/<upstream>.json``, replayed by ``make
test``). ``make fuzz`` is ``python -m scripts.histories``.
"""
