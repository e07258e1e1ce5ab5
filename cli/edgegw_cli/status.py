"""``edgegw status``: what the running gateway is doing, as tables."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from edgegw_cli._api import (
    CA_FILE_OPTION,
    CLIENT_CERT_OPTION,
    CLIENT_KEY_OPTION,
    CONFIG_OPTION,
    TOKEN_OPTION,
    URL_OPTION,
    TlsOptions,
    connect,
)
from edgegw_cli._common import console, fail, human_bytes


def _ago(ms: int | None, now_ms: int | None = None) -> str:
    """How long ago ``ms`` was, on the clock that wrote it (``now_ms``: the gateway's now).

    The gateway may be another machine with another clock: its own "now"
    (``status``'s ``clock.local_ms``) is used when given.
    """
    if not ms:
        return "never"
    now_s = time.time() if now_ms is None else now_ms / 1000
    s = max(0.0, now_s - ms / 1000)
    return f"{s:.1f}s ago" if s < 120 else f"{s / 60:.0f} min ago"


def _red(text: str) -> Text:
    return Text(text, style="red")


def _lane(lane: dict[str, Any]) -> str:
    """One priority lane: its backlog, shipped LSN and disk use against its budget."""
    held = ", held back by the link policy" if lane.get("held") else ""
    reserve = lane.get("reserve_bytes") or 0
    return (
        f"{lane['backlog_entries']} entries ({human_bytes(lane['backlog_bytes'])}) pending, "
        f"shipped through LSN {lane['shipped_lsn']}; journal "
        f"{human_bytes(lane['journal_bytes'])} of {human_bytes(lane['budget_bytes'])}"
        + (f" ({human_bytes(reserve)} reserved)" if reserve else "")
        + held
        + _dropped(lane.get("dropped"))
    )


def _dropped(d: dict[str, Any] | None) -> str:
    """What a drop-oldest lane dropped unshipped: totals, and the last ranges exactly."""
    if not d or not d.get("records"):
        return ""
    ranges = ", ".join(
        f"{r['topic']}/{r['partition']} {r['first']}-{r['last']}" for r in d["ranges"][-5:]
    )
    more = " (last 5)" if len(d["ranges"]) > 5 else ""
    return (
        f"; DROPPED unshipped (on_full = drop-oldest): {d['records']:,} records, "
        f"{human_bytes(d['bytes'])} in {d['segments']} segments: {ranges}{more}"
    )


def _lost(d: dict[str, Any]) -> Text:
    """Entries lost to damage and quarantined: the LSNs and offsets of the last losses
    (in red while one is still lost; a loss a later repair rebuilt says so)."""
    parts = []
    for loss in d["losses"][-5:]:
        ranges = ", ".join(
            f"{r['topic']}/{r['partition']} {r['first_offset']}-{r['last_offset']}"
            + ("" if r["exact"] else " (at most)")
            for r in loss["ranges"]
            if r["records"]
        )
        shipped = {True: "in the bucket", False: "not shipped", None: "shipped: unknown"}
        state = shipped[loss["repairable"]]
        if loss.get("repaired_later"):
            state = "repaired later from the bucket"
        parts.append(
            f"LSN {loss['lsn_first']}-{loss['lsn_last']} ({state}): "
            f"{ranges or 'no offsets known'}; copy {loss['copy']}"
        )
    later = d.get("repaired_later_lsns", 0)
    if d["lsns"] == 0 and later:
        return Text(
            f"{later} journal entries ({d.get('repaired_later_records', 0):,} records) lost "
            "and quarantined earlier, repaired later from the bucket; none lost now: "
            + "; ".join(parts)
        )
    also = f" ({later} more lost earlier were repaired later)" if later else ""
    return _red(
        f"DAMAGE: {d['lsns']} journal entries ({d['records']:,} records) lost and "
        f"quarantined{also}: " + "; ".join(parts)
    )


def _repaired(d: dict[str, Any]) -> str:
    """Damaged ranges rebuilt from the bucket: the LSNs and offsets of the last ones."""
    parts = []
    for rep in d["repairs"][-5:]:
        ranges = ", ".join(
            f"{r['topic']}/{r['partition']} {r['first_offset']}-{r['last_offset']}"
            for r in rep["ranges"]
        )
        what = ranges or "no records"
        parts.append(f"LSN {rep['lsn_first']}-{rep['lsn_last']}: {what}; copy {rep['copy']}")
    return (
        f"{d['ranges']} damaged ranges ({d['entries']} entries, {d['records']:,} records) "
        "rebuilt from the bucket: " + "; ".join(parts)
    )


def _live_repair(d: dict[str, Any]) -> Text:
    """The repair of damaged sealed segments while running (``journal/_live_repair.py``)."""
    line = f"{d['segments_repaired']} segments repaired while running"
    if d["pending"]:
        line += f"; {len(d['pending'])} pending (reads of them answer 503 repair_pending)"
    if d["failures"]:
        line += f"; {d['failures']} failed attempts, the last: {d['last_error']}"
    if d["given_up"]:
        return _red(
            f"{line}; GIVEN UP for segments at LSN {', '.join(map(str, d['given_up']))} "
            "(reads answer corrupt_data; see docs/operations.md, 'A damaged disk')"
        )
    return Text(line)


def _disk(d: dict[str, Any]) -> Text:
    """The filesystem under the journal: free space, and why intake stops if it does."""
    line = f"{human_bytes(d['free_bytes'])} free of {human_bytes(d['size_bytes'])} ({d['path']})"
    if d.get("segments_deleted_for_space"):
        line += f", {d['segments_deleted_for_space']} shipped segments deleted for space"
    if d["state"] == "full":
        return _red(f"FULL: {line}; produce answers 503 disk_full until space returns")
    if d["state"] == "failed":
        return _red(f"FAILED: {d.get('error')}; intake stopped, restart the gateway")
    return Text(line)


def _index_memory(j: dict[str, Any]) -> str:
    """``; index 2.1 MiB in RAM (cache 1.0 of 1.0 MiB)`` (absent from an older gateway)."""
    if "index_bytes" not in j:
        return ""
    return (
        f"; index {human_bytes(j['index_bytes'])} in RAM (cache "
        f"{human_bytes(j['index_cache_bytes'])} of {human_bytes(j['index_cache_capacity_bytes'])})"
    )


def _clock(c: dict[str, Any]) -> Text:
    """``ok, 0.4 s ahead of the bucket's clock`` (coloured when beyond the bounds)."""
    skew = c.get("skew_s")
    if skew is None:
        return Text("not compared with the bucket's yet")
    way = "ahead of" if skew > 0 else "behind"
    text = f"{c['state']}, {abs(skew):.1f} s {way} the bucket's clock"
    if abs(skew) >= 2 * 86400:
        text += f" ({abs(skew) / 86400:.1f} days)"
    if c["state"] == "gc-paused":
        return _red(f"{text} (bucket GC deletes nothing)")
    return Text(text, style="yellow") if c["state"] == "skewed" else Text(text)


def status(
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the raw status document."),
) -> None:
    """Per topic: head offsets, what is shipped, mirror lag; the shipper and each mirror.

    Example: edgegw status --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.errors import EdgeGatewayError

    with connect(config, url, token, TlsOptions(ca_file, client_cert, client_key)) as client:
        try:
            doc = client.status()
        except EdgeGatewayError as exc:
            raise fail(str(exc)) from None
    if as_json:
        console.print_json(json.dumps(doc))
        return
    render(doc)


def _api(api: dict[str, Any]) -> Text:
    """``https://127.0.0.1:8470 (TLS, client certificates required; 2 failed handshakes)``."""
    line = Text(api["url"])
    if api.get("tls"):
        notes = ["TLS"]
        if api.get("client_certificates"):
            notes.append("client certificates required")
        line.append(f" ({', '.join(notes)})")
        failures = api.get("tls_handshake_failures")
        if failures:
            line.append(f"; {failures} failed TLS handshakes", style="yellow")
    return line


def _link(k: dict[str, Any]) -> str:
    """``capped at 4.0 MB/s; 1.2 GiB today, 30.5 GiB this month``."""
    cap = k["cap_bytes_per_s"]
    head = f"capped at {cap / 1e6:.1f} MB/s" if cap else "no cap"
    line = (
        f"{head}; {human_bytes(k['day_bytes'])} today, {human_bytes(k['month_bytes'])} this month"
    )
    p = k.get("policy")
    if not p:
        return line
    parts = []
    for period, label in (("day", "today"), ("month", "this month")):
        allowance = p["daily_bytes" if period == "day" else "monthly_bytes"]
        if allowance:
            left = p[f"{period}_remaining_bytes"]
            parts.append(
                f"allowance {human_bytes(allowance)} {label}: "
                + (f"{human_bytes(left)} left" if left else "USED UP")
            )
    if p["bulk_windows"]:
        state = "open" if p["window_open"] else "closed"
        parts.append(
            f"bulk window {state} ({', '.join(p['bulk_windows'])}), "
            f"changes in {_duration(p['window_change_in_s'])}"
        )
    if not p["allowed"]["normal"]:
        parts.append(f"HOLDING normal data for {_duration(p['opens_in_s']['normal'])}")
    return line + "; " + "; ".join(parts)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _scrub(scrub: dict[str, Any], now_ms: int | None) -> Text:
    """The journal scrub's row: the last full pass and the damaged files, each named."""
    last = (
        f"last pass {_ago(scrub['last_pass_ms'], now_ms)}"
        if scrub.get("last_pass_ms")
        else "first pass under way"
    )
    damaged = scrub.get("damaged") or []
    line = Text(f"{last}, {scrub['passes']} passes, {human_bytes(scrub['bytes'])} read; ")
    if not damaged:
        line.append("0 damaged")
        return line
    line.append(f"{len(damaged)} damaged", style="red")
    for f in damaged:
        line.append(f"\n{f['file']} at byte {f['offset']}: {f['reason']}", style="red")
    return line


def _at_rest(a: dict[str, Any]) -> Text:
    """The journal's compressed sealed segments and the rewriter (``journal.at_rest``)."""
    before, after = a["compressed_wal_bytes"], a["compressed_bytes"]
    ratio = f" ({before / after:.1f}x)" if after else ""
    line = Text(
        f"{a['compressed_segments']} segments compressed, {human_bytes(before)} in "
        f"{human_bytes(after)}{ratio}; "
    )
    if a["mode"] != "compressed":
        line.append("rewriter off (journal.at_rest)")
        return line
    line.append(
        f"rewriter {'running' if a['running'] else 'stopped'}, "
        f"{a['pending_segments']} segments waiting"
    )
    if a["rewrite_failures"]:
        line.append(f", {a['rewrite_failures']} failed rewrites", style="yellow")
    return line


def _state_files(damaged: list[dict[str, Any]]) -> Text:
    """The damaged state files found at start: each named, with what was done and where it went."""
    line = Text(f"{len(damaged)} damaged", style="red")
    for d in damaged:
        line.append(f"\n{d['file']}: {d['reason']}; {d['action']}")
        if d.get("quarantined"):
            line.append(f" (copy in {d['quarantined']})")
    return line


def render(doc: dict[str, Any]) -> None:
    j, s = doc["journal"], doc["shipper"]
    head = Table(title=f"edgegw {doc['version']} — region {doc['region']}", show_header=False)
    head.add_column("", style="bold")
    head.add_column("")
    head.add_row("state", "serving" if doc["accepting"] else "not accepting writes")
    api = doc.get("api")
    if api and api.get("url"):
        head.add_row("api", _api(api))
    head.add_row("bucket", doc["bucket"])
    meta = doc.get("metadata")
    if meta:
        line = Text(meta["describe"].removeprefix("metadata: "))
        if meta.get("last_error"):
            line.append(f" ({meta['last_error']})", style="red")
        head.add_row("metadata", line)
        relay = meta.get("relay") or {}
        if relay.get("enabled"):
            head.add_row(
                "head relay",
                "active: idle mirrors wait for relayed heads"
                if relay.get("active")
                else "unavailable: mirrors poll the bucket",
            )
    head.add_row(
        "journal",
        f"{human_bytes(j['bytes'])} of {human_bytes(j['max_bytes'])} ({j['segments']} segments), "
        f"next LSN {j['next_lsn']}" + _index_memory(j),
    )
    at_rest = j.get("at_rest")
    if at_rest:
        head.add_row("at rest", _at_rest(at_rest))
    scrub = j.get("scrub")
    if scrub:
        head.add_row("scrub", _scrub(scrub, (doc.get("clock") or {}).get("local_ms")))
    disk = doc.get("disk")
    if disk:
        head.add_row("disk", _disk(disk))
    damaged_files = (doc.get("state_files") or {}).get("damaged") or []
    if damaged_files:
        head.add_row("state files", _state_files(damaged_files))
    producers = doc.get("producers")
    if producers and (producers["remembered"] or producers["issued"]):
        head.add_row(
            "producers",
            f"{producers['remembered']} idempotent producers remembered "
            f"(of {producers['max_producers']}), {producers['duplicates']} duplicates answered",
        )
    gc_doc = doc.get("python_gc")
    if gc_doc and gc_doc.get("settled"):
        head.add_row("python gc", _gc_line(gc_doc))
    heap_doc = doc.get("heap")
    if heap_doc and (heap_doc.get("arena_max") or heap_doc.get("trims")):
        head.add_row("c heap", _heap_line(heap_doc))
    claim = f"epoch {s['epoch']}, next seq {s['next_seq']}" if s["claimed"] else "not claimed yet"
    if s.get("uploads_aborted"):
        claim += f"; aborted {s['uploads_aborted']} unfinished multipart upload(s) at its claim"
    if s.get("state") == "failing":
        # Restarted again and again, shipping nothing: never "pending 0" in plain text.
        head.add_row(
            "shipper",
            _red(
                f"FAILING: {s.get('failures', 0)} runs in a row ended with an error ({claim}); "
                f"nothing ships until it is fixed: {s.get('last_error')}"
            ),
        )
    else:
        head.add_row("shipper", claim)
    if s.get("intake_hold"):
        head.add_row("intake", _red(f"held until the claim: {s['intake_hold']}"))
    head.add_row(
        "shipped",
        f"{s['objects']} objects, {human_bytes(s['wire_bytes'])}, "
        f"last {_ago(s['last_ship_ms'], (doc.get('clock') or {}).get('local_ms'))}; "
        f"{s['pending_lsns']} journal entries pending",
    )
    lanes = (doc.get("lanes") or {}).get("lanes") or []
    if len(lanes) > 1:
        for lane in lanes:
            head.add_row(f"lane {lane['lane']}", _lane(lane))
    for lane in lanes:
        if lane.get("lost"):
            head.add_row(f"lost ({lane['lane']})", _lost(lane["lost"]))
        if lane.get("repaired"):
            head.add_row(f"repaired ({lane['lane']})", _repaired(lane["repaired"]))
        if lane.get("live_repair"):
            head.add_row(f"repairing ({lane['lane']})", _live_repair(lane["live_repair"]))
    if s.get("last_error"):
        head.add_row("ship error", _red(s["last_error"]))
    enc = doc.get("encryption")
    if enc and (enc.get("enabled") or enc.get("keys")):
        held = ", ".join(f"{r}: {' '.join(ids)}" for r, ids in sorted(enc["keys"].items()))
        sealed = f"sealed with key {enc['key_id']}" if enc.get("enabled") else "shipped in clear"
        head.add_row("encryption", f"{sealed}; keys held: {held or 'none'}")
    link = doc.get("link")
    if link:
        head.add_row("link", _link(link))
    clock = doc.get("clock")
    if clock:
        head.add_row("clock", _clock(clock))
    paused = (doc.get("gc") or {}).get("paused")
    if paused:
        head.add_row("bucket gc", _red(f"paused: {paused}"))
    unsupported = (doc.get("gc") or {}).get("store_unsupported")
    if unsupported:
        head.add_row("bucket gc", _red(f"store unsupported: {unsupported}"))
    # Refusals by the bucket need a person: what is refused, and what to do.
    for component, d in sorted(doc.get("denied", {}).items()):
        head.add_row(
            f"DENIED: {component}",
            Text(
                f"the bucket refuses this gateway ({d['code']}) since {_ago(d['since_ms'])}, "
                f"{d['refusals']} attempts: {d['error']}. What to do: {d['action']}",
                style="red",
            ),
        )
    for t in doc.get("tasks", []):
        if t["degraded"]:
            when = f"restarts in {t['restart_in_s']}s" if t["state"] == "restarting" else "running"
            head.add_row(
                f"degraded: {t['name']}",
                _red(f"{t['failures']} failures ({when}); last: {t['last_error']}"),
            )
    console.print(head)

    topics = Table(title="topics")
    for col in ("topic", "kind", "home", "partitions", "records", "unshipped / lag"):
        topics.add_column(col, justify="left" if col in ("topic", "kind", "home") else "right")
    mirrors = doc.get("mirrors", {})
    for t in doc["topics"]:
        parts = t["partitions"]
        records = sum(p["next_offset"] - p["first_offset"] for p in parts)
        if t["kind"] == "local":
            lag = str(sum(p.get("unshipped", 0) for p in parts))
        else:
            m = mirrors.get(t["home"], {})
            lag = f"{m.get('entries_behind', '?')} entries" if m else "-"
        topics.add_row(t["name"], t["kind"], t["home"], str(len(parts)), f"{records:,}", lag)
    console.print(topics)

    if mirrors:
        table = Table(title="mirrors")
        for col in ("source", "state", "next seq", "behind", "ETA", "records", "problems"):
            table.add_column(
                col, justify="left" if col in ("source", "state", "problems") else "right"
            )
        for src, m in sorted(mirrors.items()):
            problems = [f"gap: {g['description']}" for g in m["gaps"]]
            problems += [f"quarantined {q['key']}: {q['reason']}" for q in m["quarantined"]]
            if m.get("missing_key"):
                problems.append(f"no key {m['missing_key']} ([encryption.sources])")
            if m.get("stopped_by"):
                problems.append(f"stopped: {m['stopped_by']}")
            elif m.get("last_error"):
                problems.append(m["last_error"])
            eta = m.get("eta_s")
            state = m["state"]
            if m.get("catching_up_priority"):
                state += f" ({m['catching_up_priority']})"
            if m.get("priority_held"):
                # another source catches up a higher priority first
                state += ", waits for a higher priority"
            table.add_row(
                src,
                state,
                str(m["next_seq"]),
                f"{m['entries_behind']} entries, {human_bytes(m['bytes_behind'])}, "
                f"{m.get('seconds_behind', 0):.0f}s"
                + (f", {m['fetches_in_flight']} fetching" if m.get("fetches_in_flight") else ""),
                f"{eta:.0f}s" if eta is not None else "-",
                f"{m['records']:,}",
                _red("; ".join(problems)) if problems else "ok",
            )
        console.print(table)

    mqtt = doc.get("mqtt")
    if mqtt:
        console.print(_mqtt_table(mqtt))
    kafka = doc.get("kafka")
    if kafka:
        console.print(_kafka_line(kafka))
        if kafka.get("groups", {}).get("groups"):
            console.print(_kafka_groups_line(kafka["groups"]))


def _gc_line(doc: dict[str, Any]) -> str:
    """The collector's pauses since the gateway became ready (edge_gateway.pygc)."""
    gens = ", ".join(
        f"gen{g} {n:,} x, {secs * 1e3:,.0f} ms, longest {longest:,.1f} ms"
        for g, (n, secs, longest) in enumerate(
            zip(doc["collections"], doc["pause_seconds"], doc["max_pause_ms"], strict=True)
        )
    )
    return f"{doc['frozen_objects']:,} startup objects frozen; collections: {gens}"


def _heap_line(doc: dict[str, Any]) -> str:
    """glibc's arena cap and the trims so far (edge_gateway.heap)."""
    cap = f"arenas capped at {doc['arena_max']}" if doc.get("arena_max") else "glibc's arenas"
    return (
        f"{cap}; {doc['trims']:,} trims, {doc['trim_seconds'] * 1e3:,.1f} ms, "
        f"longest {doc['max_trim_ms']:,.1f} ms"
    )


def _kafka_line(kafka: dict[str, Any]) -> Text:
    """The Kafka listener (docs/kafka.md) in one line: where, load, and what went wrong."""
    requests = sum(kafka["requests"].values())
    errors = ", ".join(f"{name} {n:,}" for name, n in kafka["errors"].items())
    problems = []
    if kafka["protocol_errors"]:
        problems.append(f"{kafka['protocol_errors']:,} connections closed for bad requests")
    if kafka["tls_handshake_failures"]:
        problems.append(f"{kafka['tls_handshake_failures']:,} failed TLS handshakes")
    return Text.assemble(
        f"kafka: {kafka['listen']}{' (TLS)' if kafka['tls'] else ''}, "
        f"{kafka['connections']} connections, {requests:,} requests"
        + (f"; errors: {errors}" if errors else ""),
        ("; " if problems else ""),
        _red("; ".join(problems)),
    )


def _kafka_groups_line(groups: dict[str, Any]) -> Text:
    """The Kafka consumer groups (docs/kafka.md, "Consumer groups") in one line."""
    each = "; ".join(
        f"{name} {g['state']} gen {g['generation']} {g['members']} members"
        for name, g in groups["by_group"].items()
    )
    return Text(
        f"kafka groups: {groups['groups']} groups, {groups['members']} members, "
        f"{groups['rebalances_total']:,} rebalances, "
        f"{groups['expired_members_total']:,} members expired ({each})"
    )


def _mqtt_table(mqtt: dict[str, Any]) -> Table:
    """The MQTT bridges (docs/mqtt.md): connection, counts, and what needs a look."""
    table = Table(title="mqtt")
    for col in ("bridge", "broker", "state", "messages", "problems"):
        table.add_column(col, justify="right" if col == "messages" else "left")
    for b in mqtt.get("ingest", []):
        problems = []
        if b.get("blocked"):
            problems.append(f"not reading: {b['blocked']}")
        if b.get("last_error"):
            problems.append(b["last_error"])
        idle = [f["filter"] for f in b["filters"] if f["idle"]]
        if idle:
            problems.append(f"no messages on {', '.join(idle)}")
        table.add_row(
            f"ingest {b['name']} -> {b['topic']}",
            b["broker"],
            b["state"],
            f"{b['messages_in']:,} in, {b['acked']:,} acked, {b['redeliveries']:,} redelivered",
            _red("; ".join(problems)) if problems else "ok",
        )
    for b in mqtt.get("publish", []):
        table.add_row(
            f"publish {b['name']} <- {', '.join(b['topics'])}",
            b["broker"],
            b["state"],
            f"{b['messages_out']:,} out, lag {b['lag_records']:,}",
            _red(b["last_error"]) if b.get("last_error") else "ok",
        )
    return table
