"""Screenshots of JupyterLab and the main notebook's widget panel, as a new user sees them (issue 33).

Runs with a separate tool venv's python, not the project's .venv (selenium is no dependency of the
workbench; nothing in the package or the tests imports this file):

    python3 -m venv /tmp/shotvenv && /tmp/shotvenv/bin/pip install selenium
    apt-get install -y chromium chromium-driver          # Debian's headless browser and its driver
    make lab LAB_ARGS="--no-browser --port 8899 --ServerApp.token= --ServerApp.password="   # in a fresh clone
    /tmp/shotvenv/bin/python scripts/screenshot_lab.py --out results/reference/cpu/screens

What it does, in one Chromium session: opens notebooks/distill_benchmark.ipynb at 1280x800 and 1920x1080
(lab-1280.png, lab-1920.png); runs all its cells through Lab's Run menu, as a user would, which ends with the
ipywidgets panel; screenshots the panel at both widths (panel-1280.png, panel-1920.png); then types '1O24' (a
letter O) into the panel's "hidden" box and presses Run (panel-1O24-hidden-1280.png), puts 64 back and types
'1O24' into "MLP ×" and presses Run (panel-1O24-1280.png); run-all-1280.png is the first result table after
Run All. Each step prints what it measured (viewport, kernel name, whether the panel's boxes fit the window,
error text), so a run's log says what the pictures should show. Point it at a Lab started just before: the
notebook's kernel lives as long as the server, so a second run against the same server shows higher execution
counts than a new user sees.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

NOTEBOOK = "distill_benchmark.ipynb"  # `make lab` serves notebooks/, so the path is relative to it
SIZES = [(1280, 800), (1920, 1080)]
PANEL = ".jp-OutputArea-output .widget-vbox"  # panel.Panel.widget is a VBox in the last cell's output


def browser(width: int, height: int) -> webdriver.Chrome:
    opts = webdriver.ChromeOptions()
    # headless and no sandbox: the box is a root container with no display
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    # Debian's chromium and chromedriver by path: selenium-manager would otherwise try to download a Chrome
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
    return webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))


def resize(driver, width: int, height: int) -> None:
    """Make the page's viewport (not the window) width x height: headless Chromium's window has a frame."""
    driver.set_window_size(width, height)
    dw, dh = driver.execute_script(
        "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]")
    driver.set_window_size(width + dw, height + dh)
    time.sleep(1)


def wait(driver, seconds: float, condition):
    return WebDriverWait(driver, seconds, poll_frequency=1).until(condition)


def kernel_idle(driver) -> bool:
    """The notebook toolbar's kernel status reads idle (Lab 4 marks it with a data attribute / title)."""
    return driver.execute_script(
        "const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');"
        "return s ? s.getAttribute('data-status') : null;") == "idle"


def open_notebook(driver, base: str) -> None:
    # ?reset: a workspace of its own, not whatever a previous session left open
    driver.get(f"{base}/lab/tree/{NOTEBOOK}?reset")
    wait(driver, 300, EC.presence_of_element_located((By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell")))
    wait(driver, 300, lambda d: kernel_idle(d))  # the kernel started: the toolbar shows its name
    time.sleep(3)  # fonts, the markdown's images and the collapsed parameters cell settle


def describe(driver) -> str:
    return driver.execute_script(
        "const k = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-KernelName');"
        "const errs = [...document.querySelectorAll("
        "  '.jp-RenderedText[data-mime-type=\"application/vnd.jupyter.stderr\"]')]"
        "  .map(e => e.innerText.slice(0, 300));"
        "const dlg = document.querySelector('.jp-Dialog');"
        "return 'viewport ' + window.innerWidth + 'x' + window.innerHeight"
        "  + ' | kernel: ' + (k ? k.innerText : '?')"
        "  + (dlg ? ' | dialog: ' + dlg.innerText.slice(0, 200) : '')"
        "  + ' | stderr outputs: ' + errs.length + (errs.length ? ' first: ' + errs[0] : '');")


def run_all(driver) -> None:
    """Run > Run All Cells, the menu a user clicks; then wait until the panel shows and the kernel is idle."""
    driver.find_element(By.XPATH, "//div[contains(@class,'lm-MenuBar-itemLabel') and text()='Run']").click()
    wait(driver, 10, EC.element_to_be_clickable(
        (By.XPATH, "//li[contains(@class,'lm-Menu-item')][.//div[text()='Run All Cells']]"))).click()
    wait(driver, 900, EC.presence_of_element_located((By.CSS_SELECTOR, PANEL)))
    wait(driver, 900, lambda d: kernel_idle(d))
    time.sleep(3)


def show_panel(driver):
    panel = driver.find_element(By.CSS_SELECTOR, PANEL)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", panel)
    time.sleep(2)
    return panel


def overflow(driver, panel) -> list[str]:
    """The panel's widgets whose right edge is past the notebook's visible area: what 1280 px must not have."""
    return driver.execute_script(
        "const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"
        "  || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');"
        "const right = Math.min(nb.getBoundingClientRect().right, window.innerWidth);"
        "return [...arguments[0].querySelectorAll('.jupyter-widgets')]"
        "  .filter(e => e.getBoundingClientRect().right > right + 1)"
        "  .map(e => (e.innerText || e.className).slice(0, 40));", panel)


def text_box(panel, label: str):
    return panel.find_element(By.XPATH, f".//div[contains(@class,'widget-text')][.//label[text()='{label}']]//input")


def type_and_run(driver, panel, label: str, text: str) -> str:
    """`text` into the panel's text box `label` (read when it loses focus), then the Run button, as a user
    would; the page scrolled to the panel's top. Returns what the boxes hold and the message."""
    box = text_box(panel, label)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(text, Keys.TAB)
    time.sleep(2)
    panel.find_element(By.XPATH, ".//button[contains(@class,'widget-button')][contains(normalize-space(.),'Run')]"
                       ).click()
    time.sleep(3)
    msg = panel.find_elements(By.XPATH, ".//b[starts-with(normalize-space(.), 'Not run')]")
    # the panel's top at the window's: the boxes, what they hold and the message under Run in one picture
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", panel)
    time.sleep(1)
    held = ", ".join(f"{k}={text_box(panel, k).get_attribute('value')!r}" for k in ("hidden", "MLP ×"))
    outputs = len(panel.find_elements(By.CSS_SELECTOR, ".widget-output .jp-OutputArea-child"))
    return f"{held} | run outputs: {outputs} | message: {msg[0].text if msg else '(none)'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8899")
    ap.add_argument("--out", type=Path, default=Path("results/reference/cpu/screens"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    driver = browser(*SIZES[0])
    try:
        print("browser:", driver.capabilities.get("browserVersion"))
        for w, h in SIZES:  # the notebook as it opens, before anything runs
            resize(driver, w, h)
            open_notebook(driver, args.url)
            driver.save_screenshot(str(args.out / f"lab-{w}.png"))
            print(f"lab-{w}.png:", describe(driver))
        run_all(driver)
        resize(driver, *SIZES[0])  # the first result a user reads: the versions line and the summary table
        table = driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output table")
        if table:
            driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", table[0])
            time.sleep(2)
        driver.save_screenshot(str(args.out / f"run-all-{SIZES[0][0]}.png"))
        print(f"run-all-{SIZES[0][0]}.png:", describe(driver))
        for w, h in SIZES:
            resize(driver, w, h)
            panel = show_panel(driver)
            driver.save_screenshot(str(args.out / f"panel-{w}.png"))
            print(f"panel-{w}.png:", describe(driver), "| past the right edge:", overflow(driver, panel) or "none")
        resize(driver, *SIZES[0])
        panel = show_panel(driver)
        # '1O24' (letter O) into "hidden", Run; then "hidden" back to 64 and '1O24' into "MLP ×", Run
        print(f"panel-1O24-hidden-{SIZES[0][0]}.png:", type_and_run(driver, panel, "hidden", "1O24"))
        driver.save_screenshot(str(args.out / f"panel-1O24-hidden-{SIZES[0][0]}.png"))
        text_box(panel, "hidden").send_keys(Keys.CONTROL, "a")
        text_box(panel, "hidden").send_keys("64", Keys.TAB)
        print(f"panel-1O24-{SIZES[0][0]}.png:", type_and_run(driver, panel, "MLP ×", "1O24"))
        driver.save_screenshot(str(args.out / f"panel-1O24-{SIZES[0][0]}.png"))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
