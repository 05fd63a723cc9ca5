"""The stored flows of the history search: what it found, shrunk, as data that ``make test`` replays.

``tests/histories/<upstream>.json`` holds a list of entries: ``id`` (from the history's content), ``config`` and
``steps`` (``{"op", "args"}``: what ``history.replay`` runs), ``words`` (the history in the table's words),
``found`` (the ``make fuzz`` run that found it) and ``signatures`` (its findings then). An entry may carry ``status``
(``known``: a regression of the current series that a later change fixes, or ``accepted``) and a ``reason``: its
findings then do not fail the suite. Pure functions and the file's reading and writing.
"""

import hashlib
import json
from pathlib import Path

from scripts import KitError
from scripts.histories.history import TOTAL_LIMIT
from scripts.sources import KIT_ROOT

STORE = KIT_ROOT / "tests" / "histories"


def path(upstream: str, store: Path = STORE) -> Path:
    return store / f"{upstream}.json"


def load(upstream: str, store: Path = STORE) -> list[dict]:
    """The stored flows of ``upstream`` ([] when there is no file); raises KitError naming the entry that is wrong."""
    file = path(upstream, store)
    if not file.exists():
        return []
    try:
        entries = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise KitError(f"{file} cannot be read: {e}: fix it or take it from git") from None
    for entry in entries:
        if not {"id", "config", "steps"} <= entry.keys() or entry.get("status", "known") not in ("known", "accepted"):
            raise KitError(f"{file}: an entry needs id, config and steps, and a status of known or accepted: {entry}")
        if entry.get("status") and not entry.get("reason"):
            raise KitError(f"{file}: entry {entry['id']} has a status but no reason")
    return entries


def known(entries: list[dict]) -> set[str]:
    """The kinds of finding (signatures) the search does not stop at: those of the entries with a status, which the
    stack still shows. A kind only fixed entries hold is searched again: a history of that kind now is a new one."""
    return {sig for entry in entries if entry.get("status") for sig in entry.get("signatures", [])}


def history_id(upstream: str, config: dict, steps: list[dict]) -> str:
    """``<upstream>-history-<sha1 of the configuration and steps, 8 hex>``."""
    text = json.dumps({"config": config, "steps": steps}, sort_keys=True)
    return f"{upstream}-history-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def entry_of(upstream: str, record: dict, findings: list[dict], found: str) -> dict:
    """A stored flow from a shrunk history's record."""
    derived = ("epoch", "saved_how", "folders")  # args the history adds itself when it runs a step
    steps = [{"op": s["op"], "args": {k: v for k, v in s["args"].items() if k not in derived}}
             for s in record["steps"]]
    steps = steps[1:]  # the first step is the job's start (prepare), which replay makes itself
    return {"id": history_id(upstream, record["config"], steps), "config": record["config"], "steps": steps,
            "words": words(record["config"], steps), "found": found,
            "signatures": sorted({f["signature"] for f in findings})}


def add(upstream: str, entries: list[dict], store: Path = STORE) -> list[dict]:
    """Append ``entries`` whose id is not stored yet to the file; returns those appended."""
    stored = load(upstream, store)
    ids = {e["id"] for e in stored}
    new = [e for e in entries if e["id"] not in ids]
    if new:
        path(upstream, store).write_text(json.dumps(stored + new, indent=1) + "\n")
    return new


def _save_words(a: dict) -> str:
    if a["how"] in ("every", "main-only"):
        return f"save_state({a['folder']}) on " + ("every process" if a["how"] == "every" else "the main process only")
    if a["how"] == "automatic":
        return f"save_state() on every process, which names {a['folder']} and keeps the newest {TOTAL_LIMIT}"
    if a["how"] == "dcp":
        return f"torch.distributed.checkpoint save of every loader's state_dict() into {a['folder']}"
    if a["how"] == "torch-save":
        return f"torch.save of every loader's state_dict() into {a['folder']} on every process"
    if a["how"] == "engine":
        return f"save_checkpoint(tag={a['folder']})"
    shape = {"native": "", "pr8406": " with the generator's state where #8406 writes it",
             "legacy": " as 0.19.8 writes it"}[a.get("shape", "native")]
    return f"torch.save of the sampler's state_dict() into {a['folder']}{shape}"


STEP_WORDS = {
    "train": lambda a: (f"read {a['k']} batches of loader {a['loader']}" if "loader" in a
                        else f"train {a['k']} optimizer steps"),
    "set_epoch": lambda a: f"set_epoch(the epoch) on loader {a['loader']}",
    "raise_level": lambda a: "raise the registered curriculum level",
    "state_dict": lambda a: f"state_dict() of loader {a['loader']}",
    "save": _save_words,
    "keep_last": lambda a: f"delete all but the last {a['k']} saved folders",
    "break_loop": lambda a: "leave the training loop by break (the next steps iterate the loader again)",
    "restart": lambda a: (f"crash, restart, {'build the iterator, ' if a.get('iterator_first') else ''}load "
                          f"{a['folder']}{' with load_module_only' if a.get('module_only') else ''}"
                          if a.get("folder") else "crash, start afresh"),
}


def words(config: dict, steps: list[dict]) -> str:
    """A history in the table's words: its configuration, then its steps, numbered."""
    head = ", ".join(f"{key} {', '.join(value) if isinstance(value, list) else value}"
                     for key, value in config.items())
    return head + "; " + "; ".join(f"{i + 1}. {STEP_WORDS[s['op']](s['args'])}" for i, s in enumerate(steps))
