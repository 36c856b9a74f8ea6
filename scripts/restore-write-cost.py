"""What a restore's robot writes cost the dev server, alone and 20 slots at once.

Fills a throwaway database with SLOTS slots (at least 2) of 1,000 robots, shaped like
counters but lighter (no history, no `$jsonSchema` validator: the figures are a
floor), then times, with nothing else running:
- a takeover's adoption of one slot in chunks of 10 to 200 robots (`_id $in`, one
  multi-document statement a command, as `ContextStore::adopt` sends it), and as one
  statement over the slot (`ContextStore::adopt_slot`);
- checkpoints in batches of 10 to 100 statements (a group commit);
then, with one client thread a slot, every slot's adoption at once, in chunks of 12
(what holders restoring together used), of 100, and as one statement a slot: the
robots adopted a second in all, each command's round trip, and how long a lease
renewal (`findAndModify` of a slot with `$$NOW`, every 50 ms from a client of its
own) took meanwhile.

    .venv/bin/python scripts/restore-write-cost.py MONGODB_URI [SLOTS]

The URI names the server; the database used is `slotpool_restore_write_cost`, dropped
at the end.
"""

import statistics
import sys
import threading
import time

from bson import ObjectId
from pymongo import MongoClient

PER_SLOT = 1000
NAME = "slotpool_restore_write_cost"


def adoption_update(epoch):
    gen = {"$cond": [{"$in": [{"$type": "$gen"}, ["int", "long"]]}, {"$toLong": "$gen"}, 0]}
    return [{"$set": {
        "epoch": epoch, "gen": {"$add": [gen, 1]}, "status": "running", "error": None,
        "worker": {"$literal": "10.0.0.1:7700"}, "status_at": "$$NOW",
    }}]


def adopt_chunk(db, slot, ids, epoch):
    q = {"_id": {"$in": ids}, "slot_id": slot, "epoch": {"$not": {"$gt": epoch}},
         "paused": {"$ne": True}}
    return db.command({"update": "robots", "ordered": False, "updates": [
        {"q": q, "u": adoption_update(epoch), "multi": True}]})["n"]


def adopt_slot(db, slot, epoch):
    q = {"slot_id": slot, "paused": {"$ne": True}, "epoch": {"$not": {"$gte": epoch}}}
    return db.command({"update": "robots", "ordered": False, "updates": [
        {"q": q, "u": adoption_update(epoch), "multi": True}]})["n"]


def checkpoints(db, ids, epoch):
    ups = [{"q": {"_id": i, "slot_id": "slot-001", "epoch": epoch},
            "u": [{"$set": {"context": {"n": 1}, "seq": {"$add": ["$seq", 1]},
                            "checkpointed_at": "$$NOW"}}]} for i in ids]
    return db.command({"update": "robots", "updates": ups, "ordered": False})


def fill(db, slots):
    db.robots.drop()
    db.robots.create_index("slot_id")
    db.robots.create_index("name", unique=True)
    ids = {}
    for s in range(slots):
        slot = f"slot-{s:03d}"
        docs = [{"_id": ObjectId(), "name": f"r-{s}-{i}", "kind": "counter",
                 "spec": {"interval_ms": 600000, "eager": True}, "slot_id": slot,
                 "epoch": 1, "gen": 1, "context": {"n": 0}, "seq": 0, "paused": False,
                 "status": "running"} for i in range(PER_SLOT)]
        db.robots.insert_many(docs)
        ids[slot] = [d["_id"] for d in docs]
    return ids


def alone(db, ids, epoch):
    slot = "slot-000"
    for n in (10, 25, 50, 100, 200):
        epoch += 1
        took = []
        for k in range(0, PER_SLOT, n):
            chunk = ids[slot][k:k + n]
            t = time.perf_counter()
            adopted = adopt_chunk(db, slot, chunk, epoch)
            took.append((time.perf_counter() - t) * 1000)
            assert adopted == len(chunk), f"adopted {adopted} of {len(chunk)}"
        print(f"  adoption in chunks of {n:3}: {statistics.median(took):6.1f} ms a chunk, "
              f"{sum(took) / PER_SLOT:5.3f} ms a robot, {sum(took):5.0f} ms the slot")
    for _ in range(2):
        epoch += 1
        t = time.perf_counter()
        adopted = adopt_slot(db, slot, epoch)
        took = (time.perf_counter() - t) * 1000
        assert adopted == PER_SLOT, f"adopted {adopted} of {PER_SLOT}"
        print(f"  adoption as one statement over the slot: {took:5.0f} ms")
    for n in (10, 25, 50, 100):
        took = []
        for k in range(0, PER_SLOT, n):
            t = time.perf_counter()
            checkpoints(db, ids["slot-001"][k:k + n], 1)
            took.append((time.perf_counter() - t) * 1000)
        print(f"  checkpoints in batches of {n:3}: {statistics.median(took):6.1f} ms a batch, "
              f"{sum(took) / PER_SLOT:5.3f} ms a robot")
    return epoch


def together(uri, ids, chunk, epoch):
    took, adopted, failed = [], [], []
    lock = threading.Lock()
    # Every client connected before the clock starts.
    clients = {slot: MongoClient(uri) for slot in ids}
    for c in clients.values():
        c[NAME].command("ping")
    renewer_client = MongoClient(uri)
    slots = renewer_client[NAME].slots
    slots.update_one({"_id": "slot-000"}, {"$set": {"time": None}}, upsert=True)

    def one_slot(slot):
        db = clients[slot][NAME]
        mine, n = [], 0
        try:
            if chunk == 0:
                t = time.perf_counter()
                n += adopt_slot(db, slot, epoch)
                mine.append(time.perf_counter() - t)
            else:
                for k in range(0, PER_SLOT, chunk):
                    t = time.perf_counter()
                    n += adopt_chunk(db, slot, ids[slot][k:k + chunk], epoch)
                    mine.append(time.perf_counter() - t)
        except Exception as e:  # reported below, not lost with the thread
            with lock:
                failed.append(f"{slot}: {e}")
        with lock:
            took.extend(mine)
            adopted.append(n)

    renewals = []
    done = threading.Event()

    def renewing():
        while not done.is_set():
            t = time.perf_counter()
            slots.find_one_and_update({"_id": "slot-000"}, [{"$set": {"time": "$$NOW"}}])
            renewals.append(time.perf_counter() - t)
            time.sleep(0.05)

    renewer = threading.Thread(target=renewing)
    renewer.start()
    threads = [threading.Thread(target=one_slot, args=(s,)) for s in ids]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    done.set()
    renewer.join()
    for c in [renewer_client, *clients.values()]:
        c.close()
    if failed:
        raise SystemExit("adoption failed: " + "; ".join(failed))
    total = sum(adopted)
    assert total == len(ids) * PER_SLOT, f"adopted {total} of {len(ids) * PER_SLOT}"
    took.sort()
    renewals.sort()
    what = f"chunks of {chunk}" if chunk else "one statement a slot"
    print(f"  {len(ids)} slots at once, {what}: {total / elapsed:5.0f} robots/s "
          f"adopted in all ({elapsed:4.1f} s); a command's round trip: median "
          f"{took[len(took) // 2] * 1000:5.0f} ms, slowest {took[-1] * 1000:5.0f} ms; "
          f"renewals meanwhile: median {renewals[len(renewals) // 2] * 1000:4.0f} ms, "
          f"slowest {renewals[-1] * 1000:4.0f} ms")


def main():
    uri = sys.argv[1]
    slots = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if slots < 2:
        raise SystemExit("at least 2 slots")
    db = MongoClient(uri)[NAME]
    try:
        ids = fill(db, slots)
        print(f"{slots} slots of {PER_SLOT} robots; one client, nothing else running:")
        epoch = alone(db, ids, 1)
        print("one client thread a slot, all at once:")
        for chunk in (12, 100, 0):
            epoch += 1
            together(uri, ids, chunk, epoch)
    finally:
        MongoClient(uri).drop_database(NAME)


if __name__ == "__main__":
    main()
