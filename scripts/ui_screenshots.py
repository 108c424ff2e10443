"""Screenshots of the Dagster UI after `make demo`: `python scripts/ui_screenshots.py [--out DIR]`.

Starts `dagster-webserver` on the demo's instance and settings (DAGSTER_HOME, <state>/demo.env, as
`make dev` does) on a free loopback port, saves full-page PNGs with headless Chromium, and stops the
webserver. Pages: the Backfills list and the demo's backfill with its runs, slow_path_job's runs,
the Overview timeline, plots of archive_rows' and archive_backups' metadata over partitions,
archive_rows' partitions, and each check's per-night results. Default output: <state>/screenshots (not part of the checkout).

Needs playwright (`pip install playwright`, the `screenshots` extra) and a Chromium: /usr/bin/chromium
(`apt-get install chromium`), --chromium PATH, or playwright's own (`playwright install chromium`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from memory_assets.backfill import dagster_command, start_process_group, stop_process_group  # noqa: E402
from memory_assets.dev import demo_env, prepare_dagster_home, state_dir  # noqa: E402

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHECKS = {
    "archive_backups": ("error_rate_gate", "backups_round_trip"),
    "archive_rows": ("tiers_consistent", "archive_retrievable"),
}


def pages(backfill_id: str | None) -> list[tuple[str, str, str | None]]:
    """(file name, path, label of a button or tab to click first or None), in the order a user would look.
    "LABEL@last": the last element with that text (a check's own Partitions tab, not its asset's)."""
    out: list[tuple[str, str, str | None]] = [("01-backfills", "/overview/backfills", None)]
    if backfill_id:
        out.append(("02-backfill-runs", f"/runs/b/{backfill_id}?tab=runs", None))
    out += [
        ("03-slow_path_job-runs", "/locations/memory_assets/jobs/slow_path_job/runs", None),
        ("04-timeline", "/overview/activity/timeline", "1hr"),
        ("05-archive_rows-plots", "/assets/archive_rows?view=overview", "Plots"),  # metadata over partitions
        ("06-archive_rows-partitions", "/assets/archive_rows?view=partitions", None),
        ("07-archive_backups-plots", "/assets/archive_backups?view=overview", "Plots"),
    ]
    for asset, names in CHECKS.items():
        for name in names:  # each check's result per night
            out.append(
                (f"08-check-{name}", f"/assets/{asset}?view=checks&checkDetail={name}", "Partitions@last")
            )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"dagster-webserver exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"dagster-webserver did not answer at {url} within {timeout_s:.0f} s")


def find_chromium(given: str | None) -> str | None:
    """A Chromium executable, or None to let playwright use its own download."""
    if given:
        if not Path(given).exists():
            raise SystemExit(f"--chromium={given!r}: no such file")
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/ui_screenshots.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for the PNGs (default <state>/screenshots)")
    p.add_argument("--chromium", help="Chromium executable (default: chromium on PATH)")
    p.add_argument(
        "--settle", type=float, default=6.0, help="seconds to let each page load its data (default 6)"
    )
    args = p.parse_args(argv)
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit(
            "playwright is not installed: pip install playwright (or the `screenshots` extra)"
        ) from None
    chromium = find_chromium(args.chromium)

    env = demo_env(dict(os.environ))  # exits with a clear message when the demo has not run
    home = prepare_dagster_home(env)
    os.environ.update({k: env[k] for k in ("DAGSTER_HOME", "DAGSTER_PG_URL") if k in env})
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        backfills = instance.get_backfills(limit=1)
    backfill_id = backfills[0].backfill_id if backfills else None
    if backfill_id is None:
        print(f"no backfill in {home}: run the demo first (make demo)", file=sys.stderr)
    out = (args.out or state_dir() / "screenshots").resolve()
    out.mkdir(parents=True, exist_ok=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = state_dir() / "dagster-webserver.log"
    cmd = [
        dagster_command("dagster-webserver"),
        "-w",
        str(ROOT / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    print(f"{' '.join(cmd)}  (DAGSTER_HOME={home}; log {log})", flush=True)
    server = start_process_group(cmd, env, log)
    try:
        wait_for_server(url, server, timeout_s=180)
        with sync_playwright() as pw:
            try:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            except Exception as e:  # playwright's message says which executable is missing
                raise SystemExit(
                    f"Chromium could not start ({str(e).splitlines()[0]}): apt-get install chromium, "
                    "pass --chromium PATH, or run `playwright install chromium`"
                ) from None
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            for name, path, click in pages(backfill_id):
                page.goto(url + path, wait_until="load", timeout=120_000)
                page.wait_for_timeout(args.settle * 1000)  # the UI keeps polling: no network idle to wait for
                skip = page.get_by_role("button", name="Skip")  # the first visit's "Join the community" box
                if skip.count():
                    skip.first.click()
                if click:
                    try:
                        label, _, which = click.partition("@")
                        found = page.get_by_text(label, exact=True)
                        (found.last if which == "last" else found.first).click(timeout=30_000)
                        page.wait_for_timeout(args.settle * 500)
                    except PlaywrightError:
                        print(f"{path}: no {click!r} to click; the page as it is", file=sys.stderr)
                target = out / f"{name}.png"
                page.screenshot(path=str(target), full_page=True)
                print(f"{target}  <- {path}", flush=True)
            browser.close()
    finally:
        stop_process_group(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
