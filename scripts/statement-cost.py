"""What one robot write costs the dev server, by its form.

Writes the same change to N robots, 10 statements a command (a group commit's
slow start), as update operators and as an update pipeline, and prints the
milliseconds per statement of each round. Used by scripts/bench.sh --statements.
"""

import sys
import time

from bson import ObjectId
from pymongo import MongoClient, UpdateOne

ROBOTS = 1000
PER_COMMAND = 10
ROUNDS = 3


def record(firing):
    return {
        "firing": firing, "attempt": 1, "outcome": "succeeded", "reason": None,
        "started": firing + 1, "ended": firing + 90, "lateness_ms": 1,
        "worker": "127.0.0.1:7700", "slot": "slot-001", "epoch": 1, "by": None,
        "count": None, "last": None,
    }


def main():
    uri = sys.argv[1]
    db = MongoClient(uri)["slotpool_statement_cost"]
    robots = db.robots
    for kept in (5, 50):
        robots.drop()
        ids = [ObjectId() for _ in range(ROBOTS)]
        robots.insert_many([
            {"_id": i, "name": f"r{n}", "slot_id": "slot-001", "epoch": 1, "gen": 1,
             "seq": 0, "context": {"n": 0},
             "firings": {"rev": 0, "claimed": 0, "running": [], "lost": []},
             "runs": [record(k) for k in range(kept)]}
            for n, i in enumerate(ids)
        ])
        state = {"rev": 0}

        def fence(i):
            return {"_id": i, "slot_id": "slot-001", "epoch": 1, "gen": 1,
                    "firings.rev": state["rev"]}

        def firing_state(rev):
            return {"rev": rev + 1, "claimed": rev + 1, "running": [], "lost": []}

        def end_as_operators(i):
            rev = state["rev"]
            return UpdateOne(fence(i), {
                "$set": {"firings": firing_state(rev), "write_id": ObjectId()},
                "$push": {"runs": {"$each": [record(1000 + rev)], "$slice": -kept}},
            })

        def end_as_pipeline(i):
            rev = state["rev"]
            return UpdateOne(fence(i), [
                {"$set": {
                    "firings": {"$literal": firing_state(rev)},
                    "runs": {"$slice": [{"$concatArrays": [
                        {"$cond": [{"$isArray": "$runs"}, "$runs", {"$literal": []}]},
                        {"$literal": [record(1000 + rev)]},
                    ]}, -kept]},
                }},
                {"$set": {"write_id": ObjectId()}},
            ])

        def checkpoint_as_pipeline(i):
            return UpdateOne({"_id": i, "slot_id": "slot-001", "epoch": 1, "gen": 1}, [
                {"$set": {"context": {"$literal": {"n": state["rev"]}},
                          "seq": {"$add": ["$seq", 1]}, "checkpointed_at": "$$NOW"}},
                {"$set": {"write_id": ObjectId()}},
            ])

        forms = [
            ("run end + claim, operators", end_as_operators, True),
            ("run end + claim, pipeline", end_as_pipeline, True),
            ("checkpoint, pipeline", checkpoint_as_pipeline, False),
        ]
        for _ in range(ROUNDS):
            for name, make, raises_rev in forms:
                began = time.perf_counter()
                matched = 0
                for b in range(0, ROBOTS, PER_COMMAND):
                    batch = [make(i) for i in ids[b:b + PER_COMMAND]]
                    matched += robots.bulk_write(batch, ordered=False).matched_count
                took = (time.perf_counter() - began) * 1000
                if matched != ROBOTS:
                    sys.exit(f"{name}: only {matched} of {ROBOTS} statements matched")
                if raises_rev:
                    state["rev"] += 1
                print(f"{kept:>3} runs kept | {name:<28} | {took / ROBOTS:5.2f} ms a statement")
    db.client.drop_database("slotpool_statement_cost")


if __name__ == "__main__":
    main()
