"""How a renewal's round trip on the dev server grows with the commands running
beside it, by kind.

Puts 20 slots of 1,000 robots in a database of its own, then times 20 renewals
(a `findAndModify` with `$$NOW`, as the lease's) while K clients each read one
slot's robots over and over; again while K clients each write 100 robots a
command (fenced update pipelines with `$$NOW`, as a group commit's checkpoints);
and again with one client in four reading and the rest writing; for K = 1, 5, 10,
20 (4, 8, 20 mixed). Prints the median and the slowest.

The dev server serves each connection on a thread of its own: writes to one
collection wait for each other (a lock per collection), while a read holds the
server's storage lock as it decodes what an index found, and every command takes
that lock on its way in. So a renewal queues behind no robot write, but behind
every read that runs beside it (docs/benchmarks-notes.md).

    .venv/bin/python scripts/renewal-contention.py MONGODB_URI
"""

import sys
import threading
import time

from bson import ObjectId
from pymongo import MongoClient, UpdateOne

SLOTS = 20
ROBOTS = 1000
RENEWALS = 20


def main():
    uri = sys.argv[1]
    client = MongoClient(uri)
    name = f"slotpool_renewal_contention_{int(time.time())}"
    db = client[name]
    try:
        db.robots.create_index([("slot_id", 1)])
        ids = []
        for s in range(SLOTS):
            docs = [{"_id": ObjectId(), "name": f"r{s}-{i}", "kind": "counter",
                     "spec": {"interval_ms": 1000}, "slot_id": f"slot-{s:03}",
                     "epoch": 3, "gen": 7, "context": {"n": 12345}, "seq": 44,
                     "status": "running"} for i in range(ROBOTS)]
            ids.append([d["_id"] for d in docs])
            for i in range(0, ROBOTS, 250):
                db.robots.insert_many(docs[i:i + 250])
        db.slots.insert_one({"_id": "slot-000", "time": None})

        def reader(k, stop):
            with MongoClient(uri) as c:
                robots = c[name].robots
                while not stop[0]:
                    list(robots.find({"slot_id": f"slot-{k:03}"}))

        def writer(k, stop):
            slot = f"slot-{k:03}"
            with MongoClient(uri) as c:
                robots = c[name].robots
                j = 0
                while not stop[0]:
                    some = ids[k][(j % 10) * 100:(j % 10 + 1) * 100]
                    robots.bulk_write(
                        [UpdateOne({"_id": i, "slot_id": slot, "epoch": 3},
                                   [{"$set": {"seq": {"$add": ["$seq", 1]},
                                              "checkpointed_at": "$$NOW",
                                              "context": {"n": j}}}])
                         for i in some],
                        ordered=False)
                    j += 1

        def mixed(k, stop):
            (reader if k % 4 == 0 else writer)(k, stop)

        def measure(kind, k):
            stop = [False]
            threads = [threading.Thread(target=kind, args=(i, stop), daemon=True)
                       for i in range(k)]
            for t in threads:
                t.start()
            took = []
            try:
                time.sleep(1)
                for _ in range(RENEWALS):
                    t = time.monotonic()
                    db.slots.find_one_and_update({"_id": "slot-000"},
                                                 [{"$set": {"time": "$$NOW"}}])
                    took.append(time.monotonic() - t)
                    time.sleep(0.05)
            finally:
                stop[0] = True
                for t in threads:
                    t.join()
            took.sort()
            what = {"reader": "reading a slot of 1,000 robots",
                    "writer": "writing 100 robots a command",
                    "mixed": "one in four reading, the rest writing"}[kind.__name__]
            print(f"renewal beside {k:2} clients {what}: median {took[len(took) // 2] * 1000:.0f} ms, "
                  f"slowest {took[-1] * 1000:.0f} ms", flush=True)

        for kind in (reader, writer):
            for k in (1, 5, 10, 20):
                measure(kind, k)
        for k in (4, 8, 20):
            measure(mixed, k)
    finally:
        client.drop_database(name)
        client.close()


if __name__ == "__main__":
    main()
