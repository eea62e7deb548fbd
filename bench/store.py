"""Store benchmark: our S3 backend vs plain boto3 on the same endpoint, in the same run.

- 1 GiB file: `commit_stage` (sha256 in the same pass, multipart) vs `client.upload_file`, and
  `download_stage_file` (verified) vs `client.download_file`;
- 10,000 small objects (1 KiB): one `commit_stage` + `read_stage(...).prefetch()` vs `upload_file` /
  `download_file` per object with the same number of threads;
- commit latency: a commit of an empty stage (existence check + create-only marker), and the bare
  marker write.

The endpoint is moto's S3 server on loopback (started here; tests/s3server.py), or with `--endpoint rgw`
Ceph's RADOS Gateway that infra/s3/ceph/start.sh started (its PROBEPO_TEST_RGW_* variables in the
environment). Writes bench/results/store.json: moto's figures at the top level, RGW's in its `rgw`
section; a run replaces its own and keeps the other's. `markdown` renders the file as docs/BENCHMARKS.md's
tables (the site renders them from it).
Usage: .venv/bin/python bench/store.py [--endpoint moto|rgw] [--small N] [--big-mib N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import boto3  # noqa: E402
import botocore  # noqa: E402
from benchlib import machine, marked, recorded, table  # noqa: E402

from probepo.store import open_store  # noqa: E402
from probepo.store.store import UPLOAD_WORKERS  # noqa: E402
from tests.s3server import S3Server, isolated_aws_env, running_s3_server, start_s3_server  # noqa: E402

ENDPOINTS = {
    "moto": "moto S3 server (tests/s3server.py) on 127.0.0.1, same machine",
    "rgw": "Ceph RGW 16.2.15 (Debian 12 packages; infra/s3/ceph: one monitor, one memstore OSD, beast "
    "frontend) on 127.0.0.1, same machine",
}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def write_random_file(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        remaining = size
        while remaining:
            chunk = os.urandom(min(64 << 20, remaining))
            handle.write(chunk)
            remaining -= len(chunk)


def empty_bucket(client, bucket: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def bench_big(client, bucket: str, work: Path, size: int, rounds: int) -> dict:
    source = work / "big.bin"
    write_random_file(source, size)
    store = open_store(f"s3://{bucket}/ours")
    times = {"ours_up": [], "boto_up": [], "ours_down": [], "boto_down": []}
    for round_index in range(rounds):
        # Alternate who goes first so page cache and server warm-up favour neither.
        order = ["boto", "ours"] if round_index % 2 else ["ours", "boto"]
        for who in order:
            if who == "ours":
                times["ours_up"].append(
                    timed(
                        lambda r=round_index: store.commit_stage(
                            "bench", r, "checkpoint", {"big.bin": source}
                        )
                    )
                )
            else:
                times["boto_up"].append(
                    timed(lambda r=round_index: client.upload_file(str(source), bucket, f"plain/{r}"))
                )
        dest = work / "down.bin"
        for who in order:
            if who == "ours":
                times["ours_down"].append(
                    timed(
                        lambda r=round_index, d=dest: store.download_stage_file(
                            "bench", r, "checkpoint", "big.bin", d
                        )
                    )
                )
            else:
                times["boto_down"].append(
                    timed(lambda r=round_index, d=dest: client.download_file(bucket, f"plain/{r}", str(d)))
                )
            dest.unlink()
        empty_bucket(client, bucket)
    source.unlink()
    best = {name: min(values) for name, values in times.items()}
    mib = size / (1 << 20)
    return {
        "size_bytes": size,
        "rounds": rounds,
        "seconds_best": {name: round(value, 3) for name, value in best.items()},
        "mib_per_s": {name: round(mib / value, 1) for name, value in best.items()},
        "upload_ratio": best["boto_up"] / best["ours_up"],
        "download_ratio": best["boto_down"] / best["ours_down"],
    }


def bench_small(client, bucket: str, work: Path, count: int, size: int) -> dict:
    payloads = {f"obj-{i:05d}.bin": os.urandom(size) for i in range(count)}
    folder = work / "small"
    folder.mkdir()
    for name, data in payloads.items():
        (folder / name).write_bytes(data)
    store = open_store(f"s3://{bucket}/ours")

    def boto_up() -> None:
        with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
            list(
                pool.map(
                    lambda name: client.upload_file(str(folder / name), bucket, f"plain/{name}"), payloads
                )
            )

    def boto_down() -> None:
        out = work / "small-down"
        out.mkdir(exist_ok=True)
        with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
            list(
                pool.map(
                    lambda name: client.download_file(bucket, f"plain/{name}", str(out / name)), payloads
                )
            )

    results = {
        "ours_up": timed(lambda: store.commit_stage("bench", 0, "sample", payloads)),
        "boto_up": timed(boto_up),
    }
    fetched = {}
    results["ours_down"] = timed(lambda: fetched.update(store.read_stage("bench", 0, "sample").prefetch()))
    results["boto_down"] = timed(boto_down)
    assert fetched == payloads
    empty_bucket(client, bucket)
    total_ours = results["ours_up"] + results["ours_down"]
    total_boto = results["boto_up"] + results["boto_down"]
    return {
        "count": count,
        "object_bytes": size,
        "threads": UPLOAD_WORKERS,
        "seconds": {name: round(value, 3) for name, value in results.items()},
        "objects_per_s": {name: round(count / value, 1) for name, value in results.items()},
        "upload_ratio": results["boto_up"] / results["ours_up"],
        "download_ratio": results["boto_down"] / results["ours_down"],
        "ratio": total_boto / total_ours,
    }


def bench_commit_latency(bucket: str, trials: int) -> dict:
    store = open_store(f"s3://{bucket}/latency")
    commits, markers = [], []
    for trial in range(trials):
        commits.append(timed(lambda t=trial: store.commit_stage("lat", t, "select", {})))
        markers.append(
            timed(lambda t=trial: store.objects.put_if_absent(f"raw/{t}.json", b'{"format":1}' * 40))
        )
    return {
        "trials": trials,
        "commit_empty_stage_ms_median": round(1000 * statistics.median(commits), 2),
        "commit_empty_stage_ms_p90": round(1000 * statistics.quantiles(commits, n=10)[-1], 2),
        "marker_put_if_absent_ms_median": round(1000 * statistics.median(markers), 2),
    }


def rgw_server() -> S3Server:
    """The RADOS Gateway infra/s3/ceph/start.sh started, from the variables it prints."""
    try:
        endpoint = os.environ["PROBEPO_TEST_RGW_ENDPOINT"]
        credentials = {
            "AWS_ACCESS_KEY_ID": os.environ["PROBEPO_TEST_RGW_ACCESS_KEY"],
            "AWS_SECRET_ACCESS_KEY": os.environ["PROBEPO_TEST_RGW_SECRET_KEY"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    except KeyError as missing:
        sys.exit(
            f'--endpoint rgw: {missing.args[0]} is unset; run `eval "$(sudo bash infra/s3/ceph/start.sh)"`'
        )
    return running_s3_server(endpoint, credentials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="moto")
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--small-bytes", type=int, default=1024)
    parser.add_argument("--latency-trials", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "store.json")
    args = parser.parse_args()

    server = start_s3_server() if args.endpoint == "moto" else rgw_server()
    os.environ.update(isolated_aws_env(server))
    try:
        client = boto3.client("s3")
        bucket = f"probepo-bench-{int(time.time())}"
        client.create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="probepo-bench-store-") as work:
            big = bench_big(client, bucket, Path(work), args.big_mib << 20, args.rounds)
            print("big:", json.dumps(big), flush=True)
            small = bench_small(client, bucket, Path(work), args.small, args.small_bytes)
            print("small:", json.dumps(small), flush=True)
        latency = bench_commit_latency(bucket, args.latency_trials)
        print("latency:", json.dumps(latency), flush=True)
    finally:
        server.stop()

    result = {
        "upload_1gib_ratio_vs_boto3": round(big["upload_ratio"], 3),
        "download_1gib_ratio_vs_boto3": round(big["download_ratio"], 3),
        "small_objects_ratio_vs_boto3": round(small["ratio"], 3),
        "commit_latency_ms": latency["commit_empty_stage_ms_median"],
        "details": {"big_file": big, "small_objects": small, "commit_latency": latency},
        "endpoint": ENDPOINTS[args.endpoint],
        "machine": machine(),
        "versions": {"boto3": boto3.__version__, "botocore": botocore.__version__},
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(["bench/store.py", *sys.argv[1:]]),
    }
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.endpoint == "rgw":
        kept["rgw"] = result
    else:
        kept = {**result, **({"rgw": kept["rgw"]} if "rgw" in kept else {})}
    args.out.write_text(json.dumps(kept, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
    print(markdown(kept))


def endpoint_table(result: dict) -> str:
    """One endpoint's table: ours against plain boto3, as measured in one run."""
    big, small = result["details"]["big_file"], result["details"]["small_objects"]
    latency = result["details"]["commit_latency"]
    seconds, rate = big["seconds_best"], big["mib_per_s"]
    size = f"{big['size_bytes'] / 2**30:g} GiB"

    def transfer(who: str) -> str:
        return f"{seconds[who]:.1f} s, {rate[who]:.3g} MiB/s"

    def objects(who: str) -> str:
        total = small["seconds"][f"{who}_up"] + small["seconds"][f"{who}_down"]
        per_s = small["objects_per_s"]
        return f"{total:.0f} s ({per_s[f'{who}_up']:.0f} up / {per_s[f'{who}_down']:.0f} down objects/s)"

    rows = [
        [
            f"upload {size} (`commit_stage` with sha256 vs `upload_file`)",
            transfer("ours_up"),
            transfer("boto_up"),
            f"**{big['upload_ratio']:.2f}**",
        ],
        [
            f"download {size} (`download_stage_file`, verified, vs `download_file`)",
            transfer("ours_down"),
            transfer("boto_down"),
            f"{big['download_ratio']:.2f}",
        ],
        [
            f"{small['count']:,} × {small['object_bytes'] / 1024:g} KiB objects, up + down"
            " (one `commit_stage` + `read_stage().prefetch()` vs `upload_file`/`download_file` per object,"
            f" {small['threads']} threads each)",
            objects("ours"),
            objects("boto"),
            f"{small['ratio']:.2f}",
        ],
        [
            "commit latency: empty stage (HEAD + create-only marker PUT), median / p90 of"
            f" {latency['trials']}",
            f"{latency['commit_empty_stage_ms_median']:.1f} / {latency['commit_empty_stage_ms_p90']:.1f} ms",
            "–",
            "–",
        ],
        [
            "bare create-only marker PUT (`If-None-Match: *`), median",
            f"{latency['marker_put_if_absent_ms_median']:.1f} ms",
            "–",
            "–",
        ],
    ]
    versions = ", ".join(f"{name} {version}" for name, version in result.get("versions", {}).items())
    head = recorded(result, "bench/results/store.json") + f"; endpoint: {result['endpoint']}; {versions}."
    header = ["measurement", "ours", "plain boto3", "ratio (target ≥ 0.9)"]
    return "\n".join([head, "", *table(header, rows)])


def markdown(results: dict) -> str:
    """docs/BENCHMARKS.md's store tables, rendered from bench/results/store.json when the site is built:
    moto's (the top level), then RGW's (its `rgw` section)."""
    parts = [marked("moto", endpoint_table(results))]
    if "rgw" in results:
        parts.append(marked("rgw", endpoint_table(results["rgw"])))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
