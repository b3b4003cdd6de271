"""A tiny ALFWorld-style room, written in the standard layout, for runs without the real data.

``write_demo_tasks(root)`` writes one task of each of the six ALFWorld task types, all in the same
small room (8 receptacles, 6 objects), as ``initial_state.pddl`` + ``traj_data.json`` under
``root/json_2.1.1/<split>/``. The problems use the PDDL domain that the ``alfworld`` package ships
(``alfworld/data/alfred.pddl``): the same predicates, object naming (``Name_bar_<coords>``, which
alfworld's Demangler turns into "name 1") and goal formulas as the released json_2.1.1 tasks, so
the whole path (game rebuild, engine, wrappers, handcoded expert) runs on them as on real tasks.
Tests and the benchmark use them where ../shared/data is absent (a user's clone).
"""

from __future__ import annotations

import json
import os
import pathlib

from agentrl_jax.envs.alfworld.data import JSON_DIR, SPLITS


def _mangle(alfred_id: str) -> str:
    """ALFRED's "Class|x|y|z" id as PDDL names it (the inverse of alfworld's Demangler)."""
    for char, word in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_")):
        alfred_id = alfred_id.replace(char, word)
    return alfred_id


# receptacle id -> (type, location number, openable)
_RECEPTACLES = {
    _mangle("CounterTop|+00.50|+00.90|+01.00"): ("CounterTop", 1, False),
    _mangle("DiningTable|-01.00|+00.00|+02.00"): ("DiningTable", 2, False),
    _mangle("Fridge|+01.50|+00.00|-01.00"): ("Fridge", 3, True),
    _mangle("Microwave|+00.20|+01.10|-01.20"): ("Microwave", 4, True),
    _mangle("Sink|+00.90|+00.90|-01.40|SinkBasin"): ("SinkBasin", 5, False),
    _mangle("Cabinet|-00.30|+00.40|-01.30"): ("Cabinet", 6, True),
    _mangle("SideTable|-02.00|+00.00|+00.50"): ("SideTable", 7, False),
    _mangle("Shelf|-02.10|+01.20|-00.80"): ("Shelf", 8, False),
}
_IN = {t: r for r, (t, _, _) in _RECEPTACLES.items()}  # type -> receptacle id (one of each)
# object id -> (type, receptacle id, properties)
_OBJECTS = {
    _mangle("Apple|+00.40|+00.95|+01.10"): (
        "Apple",
        _IN["CounterTop"],
        ("pickupable", "heatable", "coolable"),
    ),
    _mangle("Apple|-01.10|+00.80|+02.10"): (
        "Apple",
        _IN["DiningTable"],
        ("pickupable", "heatable", "coolable"),
    ),
    _mangle("Mug|-00.30|+00.45|-01.30"): (
        "Mug",
        _IN["Cabinet"],
        ("pickupable", "isReceptacleObject", "cleanable", "heatable", "coolable"),
    ),
    _mangle("AlarmClock|-02.00|+01.25|-00.90"): ("AlarmClock", _IN["Shelf"], ("pickupable",)),
    _mangle("AlarmClock|-02.10|+01.25|-00.70"): ("AlarmClock", _IN["Shelf"], ("pickupable",)),
    _mangle("DeskLamp|-02.05|+00.60|+00.60"): ("DeskLamp", _IN["SideTable"], ("toggleable",)),
}
# receptacle type -> object types it can hold
_CAN_CONTAIN = {
    "CounterTop": ("Apple", "Mug", "AlarmClock"),
    "DiningTable": ("Apple", "Mug", "AlarmClock"),
    "Fridge": ("Apple", "Mug"),
    "Microwave": ("Apple", "Mug"),
    "SinkBasin": ("Apple", "Mug"),
    "Cabinet": ("Mug",),
    "SideTable": ("Apple", "Mug", "AlarmClock", "DeskLamp"),
    "Shelf": ("Mug", "AlarmClock"),
}
_START = "loc_bar_0_bar_0_bar_0_bar_0"

_PLACE_GOAL = """(exists (?r - receptacle)
        (exists (?o - object)
            (and {extra}
                (objectType ?o {obj}Type)
                (receptacleType ?r {recep}Type)
                (inReceptacle ?o ?r))))"""
_LOOK_GOAL = """(exists (?ot - object ?r - receptacle ?a - agent ?l - location)
            (and (objectType ?ot {toggle}Type) (toggleable ?ot) (isToggled ?ot)
                 (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))
        (exists (?o - object ?a - agent) (and (objectType ?o {obj}Type) (holds ?a ?o)))"""
_TWO_GOAL = """(exists (?r - receptacle)
        (exists (?o1 - object)
            (and (objectType ?o1 {obj}Type) (receptacleType ?r {recep}Type) (inReceptacle ?o1 ?r)
                 (exists (?o2 - object)
                     (and (not (= ?o1 ?o2)) (objectType ?o2 {obj}Type)
                          (receptacleType ?r {recep}Type) (inReceptacle ?o2 ?r))))))"""

# task type -> (object_target, parent_target, toggle_target, goal formula, human description)
DEMO_TASKS = {
    "pick_and_place_simple": (
        "Mug",
        "CounterTop",
        "",
        _PLACE_GOAL.format(extra="", obj="Mug", recep="CounterTop"),
        "Put the mug from the cabinet on the counter.",
    ),
    "look_at_obj_in_light": (
        "AlarmClock",
        "",
        "DeskLamp",
        _LOOK_GOAL.format(toggle="DeskLamp", obj="AlarmClock"),
        "Look at an alarm clock under the desk lamp.",
    ),
    "pick_clean_then_place_in_recep": (
        "Mug",
        "Shelf",
        "",
        _PLACE_GOAL.format(extra="(cleanable ?o) (isClean ?o)", obj="Mug", recep="Shelf"),
        "Rinse the mug and put it on the shelf.",
    ),
    "pick_heat_then_place_in_recep": (
        "Apple",
        "DiningTable",
        "",
        _PLACE_GOAL.format(extra="(heatable ?o) (isHot ?o)", obj="Apple", recep="DiningTable"),
        "Warm an apple in the microwave and put it on the table.",
    ),
    "pick_cool_then_place_in_recep": (
        "Apple",
        "SideTable",
        "",
        _PLACE_GOAL.format(extra="(coolable ?o) (isCool ?o)", obj="Apple", recep="SideTable"),
        "Chill an apple and put it on the side table.",
    ),
    "pick_two_obj_and_place": (
        "AlarmClock",
        "DiningTable",
        "",
        _TWO_GOAL.format(obj="AlarmClock", recep="DiningTable"),
        "Put two alarm clocks on the dining table.",
    ),
}
DEMO_TRIAL = "trial_T00000000_000000_000000"


def demo_problem(task_type: str, name: str = "demo") -> str:
    """The PDDL problem text of the demo room with the goal of ``task_type``."""
    if task_type not in DEMO_TASKS:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {tuple(DEMO_TASKS)}")
    goal = DEMO_TASKS[task_type][3]
    loc = {r: f"loc_bar_{spec[1]}_bar_0_bar_0_bar_0" for r, spec in _RECEPTACLES.items()}
    rtypes = sorted({t for t, _, _ in _RECEPTACLES.values()})
    otypes = sorted({t for t, _, _ in _OBJECTS.values()})
    objects = ["agent1 - agent"]
    objects += [f"{t}Type - rtype" for t in rtypes] + [f"{t}Type - otype" for t in otypes]
    objects += [f"{r} - receptacle" for r in _RECEPTACLES] + [f"{o} - object" for o in _OBJECTS]
    objects += [f"{x} - location" for x in [_START, *loc.values()]]
    init = [f"(atLocation agent1 {_START})"]
    for r, (rtype, _, openable) in _RECEPTACLES.items():
        init += [f"(receptacleType {r} {rtype}Type)", f"(receptacleAtLocation {r} {loc[r]})"]
        init += [f"(openable {r})"] if openable else []
    for o, (otype, recep, props) in _OBJECTS.items():
        init += [
            f"(objectType {o} {otype}Type)",
            f"(inReceptacle {o} {recep})",
            f"(objectAtLocation {o} {loc[recep]})",
        ]
        init += [f"({p} {o})" for p in props]
    init += [f"(canContain {r}Type {o}Type)" for r, os_ in _CAN_CONTAIN.items() for o in os_]
    body = "\n        ".join
    return (
        f"(define (problem plan_{name})\n(:domain alfred)\n(:objects\n        "
        f"{body(objects)}\n)\n(:init\n        {body(init)}\n)\n"
        f"(:goal\n    (and\n        {goal}\n    )\n)\n)\n"
    )


def demo_traj_data(task_type: str) -> dict:
    """The trimmed ``traj_data.json`` of a demo task (the fields the text game reads)."""
    obj, parent, toggle, _, desc = DEMO_TASKS[task_type]
    return {
        "task_id": DEMO_TRIAL,
        "task_type": task_type,
        "pddl_params": {
            "object_target": obj,
            "parent_target": parent,
            "toggle_target": toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": desc}]},
    }


def demo_task_id(task_type: str) -> str:
    """The id ``"<task-folder>/<trial>"`` of the demo task of ``task_type``."""
    obj, parent, toggle, _, _ = DEMO_TASKS[task_type]
    return f"{task_type}-{obj}-None-{parent or toggle}-0/{DEMO_TRIAL}"


def write_demo_tasks(
    root: str | os.PathLike, split: str = "train", task_types: tuple[str, ...] | None = None
) -> list[str]:
    """Writes demo tasks in the standard layout under ``root`` and returns their ids (sorted).

    Args:
      root: the data root (the folder that will hold ``json_2.1.1``).
      split: which split folder to write them to.
      task_types: which types (default all six).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; expected one of {SPLITS}")
    ids = []
    for task_type in task_types or tuple(DEMO_TASKS):
        task_id = demo_task_id(task_type)
        folder = pathlib.Path(root) / JSON_DIR / split / task_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "initial_state.pddl").write_text(demo_problem(task_type), encoding="utf-8")
        (folder / "traj_data.json").write_text(
            json.dumps(demo_traj_data(task_type)), encoding="utf-8"
        )
        ids.append(task_id)
    return sorted(ids)
