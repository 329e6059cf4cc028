"""The watch caches keep each decoded object's keys and short strings once for all objects."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from gpufleet.kube import cache


def job_text(i: int) -> str:
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"train-{i:05d}",
            "namespace": "nlp",
            "uid": f"3f1c2d4e-aaaa-bbbb-cccc-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-12-03T02:40:00Z",
            "labels": {"gpufleet.io/team": "nlp", "gpufleet.io/class": "elastic"},
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        },
        "spec": {
            "parallelism": 1,
            "completionMode": "NonIndexed",
            "suspend": False,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "command": ["sleep", "3600"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                }
            },
        },
        "status": {"active": 1, "startTime": f"2026-12-03T02:41:{i % 60:02d}Z"},
    }
    return json.dumps(job)


def test_stored_objects_are_unchanged_and_share_their_keys_and_short_strings() -> None:
    store = cache.Store("jobs")
    decoded = [json.loads(job_text(i)) for i in range(2)]
    expected = [json.loads(job_text(i)) for i in range(2)]
    for obj in expected:
        del obj["metadata"]["managedFields"]  # what the store's trim drops
    for obj in decoded:
        assert store.upsert(obj)
    a, b = (store.objects[("nlp", f"train-{i:05d}")] for i in range(2))
    assert [a, b] == expected
    # one string object for a key or a short value, whichever object it came from
    (key_a,) = [k for k in a["metadata"] if k == "creationTimestamp"]
    (key_b,) = [k for k in b["metadata"] if k == "creationTimestamp"]
    assert key_a is key_b
    assert a["spec"]["completionMode"] is b["spec"]["completionMode"]
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    # a long, unique value is left as it was decoded
    assert a["metadata"]["uid"] != b["metadata"]["uid"]


def test_a_compacted_cache_holds_thousands_of_jobs_in_less_memory() -> None:
    texts = [job_text(i) for i in range(2000)]

    def held(keep: Any) -> int:
        tracemalloc.start()
        objects = [keep(json.loads(t)) for t in texts]
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(objects) == len(texts)
        return used

    as_decoded, compacted = held(lambda o: o), held(cache.compact)
    assert compacted < 0.7 * as_decoded, (compacted, as_decoded)
