"""The HTML report in a real (headless) browser: reports.browser on a report built from the fixture
CSV, on one with broken images, and its errors and clean-up. Skipped without a browser."""

import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from reports import browser

from conftest import FIXTURES, run_cli

# The tests that start a browser; without one they skip, naming the package to install.
needs_browser = pytest.mark.skipif(browser.find_browser() is None, reason=browser.why_missing())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    shutil.copy(FIXTURES / "results.csv", out / "results.csv")
    result = run_cli("report", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def checked(built, tmp_path_factory):
    shot = tmp_path_factory.mktemp("shot") / "report.png"
    return browser.check_report(str(built / "report" / "index.html"), str(shot))


@pytest.fixture
def spawned(monkeypatch, tmp_path):
    """Profiles go under a folder of this test's own, and the Popen objects of the browsers started
    are listed, so a test can look for what a check left running."""
    temp = tmp_path / "browser-temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    started = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        proc = popen(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(browser.subprocess, "Popen", recording)
    return temp, started


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR"), f"{path} does not start with an IHDR chunk"
    return struct.unpack(">II", data[16:24])


def left_running(profile_root, started):
    """Live (not zombie) processes whose command line names PROFILE_ROOT or that are in the
    process group of a browser started: what a check must not leave behind."""
    groups = {p.pid for p in started}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        state, _, pgid = stat.rsplit(")", 1)[1].split()[:3]
        if state != "Z" and (str(profile_root).encode() in cmdline or int(pgid) in groups):
            words = cmdline.decode(errors="replace").split("\0")
            found.append(f"{pid} {' '.join(words)[:200]}")
    return found


@needs_browser
def test_every_image_loads(built, checked):
    page = (built / "report" / "index.html").read_text()
    srcs = re.findall(r"<img src='([^']+)'", page)
    assert srcs, "the report has no images to check"
    assert [src for src, *_ in checked.images] == srcs
    assert checked.broken == []
    for src, loaded, width, height in checked.images:
        assert loaded and width >= 400 and height >= 300, (src, width, height)
        assert (width, height) == png_size(built / "report" / src)


@needs_browser
def test_tables_title_and_no_console_errors(checked):
    assert checked.tables >= 1 and checked.table_rows > checked.tables
    assert checked.title.startswith("kolo sweep report")
    assert checked.console_errors == []
    assert checked.ok


@needs_browser
def test_screenshot_is_a_full_page_png(checked):
    assert checked.screenshot is not None and os.path.isfile(checked.screenshot)
    width, height = png_size(checked.screenshot)
    assert width >= browser.WINDOW[0]  # wider when a table is wider than the window
    assert height > browser.WINDOW[1]  # the whole page, not only the first screen


@needs_browser
def test_broken_images_are_reported(built, tmp_path, capsys):
    copy = tmp_path / "report"
    shutil.copytree(built / "report", copy)
    (copy / "plots" / "fusion.png").unlink()
    (copy / "plots" / "scaling.png").write_bytes(b"not a PNG")
    result = browser.check_report(str(copy / "index.html"), None)
    assert sorted(result.broken) == ["plots/fusion.png", "plots/scaling.png"]
    assert any("fusion.png" in e for e in result.console_errors)  # the missing file is logged
    assert not result.ok and result.screenshot is None

    assert browser.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "broken image: plots/fusion.png" in out and "broken image: plots/scaling.png" in out
    assert f"3 of {len(result.images)} images loaded" in out


@needs_browser
def test_command_passes_a_good_report(built, tmp_path, capsys):
    shot = tmp_path / "shot.png"
    assert browser.main([str(built), "--screenshot", str(shot)]) == 0
    out = capsys.readouterr().out.strip()
    summary = r"(\d+) of \1 images loaded, \d+ tables \(\d+ rows\), 0 console errors; screenshot (.*)"
    match = re.fullmatch(summary, out)
    assert match and match[2] == str(shot), out
    assert png_size(shot)[0] > 0


@needs_browser
def test_script_errors_are_console_errors(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        "<title>t</title><table><tr><td>1</td></tr></table><script>throw new Error('bad')</script>"
    )
    result = browser.check_report(str(page), None)
    assert any("Error: bad" in e for e in result.console_errors), result.console_errors
    assert not result.ok


def test_missing_page_is_a_clear_error(tmp_path, spawned):
    temp, started = spawned
    with pytest.raises(browser.BrowserError, match=r"missing\.html: no such file"):
        browser.check_report(str(tmp_path / "missing.html"), None)
    assert left_running(temp, started) == []
    assert os.listdir(temp) == []


@needs_browser
def test_timeout_leaves_nothing_behind(tmp_path, spawned):
    temp, started = spawned
    page = tmp_path / "spin.html"
    page.write_text("<title>spin</title><script>while (true) {}</script>")  # never fires load
    with pytest.raises(browser.BrowserError, match=r"timed out after 3 s waiting for Page\.loadEventFired"):
        browser.check_report(str(page), None, timeout_s=3)
    assert len(started) == 1  # a browser ran ...
    assert left_running(temp, started) == []  # ... and nothing of it is left
    assert os.listdir(temp) == []  # nor its profile


def test_no_browser_is_exit_status_2(monkeypatch, capsys):
    monkeypatch.setenv("KOLO_BROWSER", "/nonexistent/browser")
    assert browser.find_browser() is None
    assert browser.main(["anything"]) == 2
    assert "KOLO_BROWSER=/nonexistent/browser" in capsys.readouterr().err
