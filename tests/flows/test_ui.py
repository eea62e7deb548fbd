"""Prefect's UI in a real browser (Debian's Chromium, headless, driven by Selenium with the system
chromedriver), logged in with the API's password: a preset's deployment opens its run form on the recipe,
field by field with its descriptions; the testbed preset launched by changing two fields completes on the
site's SLURM executor and its artifacts are listed on its page; the form refuses a value out of range
naming the field, and a cross-field error ends the flow run at once with one line shown on its page.
Screenshots are kept in $PROBEPO_TEST_SCREENSHOTS (default out/ui-screenshots)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probepo.config import RunConfig
from tests.flows import NEEDS_PREFECT
from tests.flows.conftest import TESTBED
from tests.flows.test_deployments import _wait_for_end

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    NEEDS_PREFECT,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="needs Debian's chromium and chromium-driver (infra/browser/install.sh)",
    ),
]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("PROBEPO_TEST_SCREENSHOTS", ROOT / "out" / "ui-screenshots"))


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def _until(driver, condition: Callable[[], object], what: str, timeout_s: float = 60) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    driver.save_screenshot(str(SHOTS / "failed.png"))
    raise AssertionError(f"the UI did not show {what} within {timeout_s} s (screenshots: {SHOTS})")


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _run_of(deployment_id, run_id: str):
    """The id of the flow run of the deployment whose run_id parameter is `run_id` (None until there)."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    return next((run.id for run in runs if run.parameters.get("run_id") == run_id), None)


def _field(driver, label: str, control: str):
    """The `control` (input, textarea) of the run form's field labelled `label`."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.XPATH, _xpath(label, control))


def _xpath(label: str, control: str) -> str:
    title = f"//span[@class='schema-form-property__label' and text()=\"{label}\"]"
    prop = "ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]"
    return f"{title}/{prop}//{control}"


def _log_in(driver, ui: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{ui}/login")
    field = _until(
        driver, lambda: driver.find_elements(By.CSS_SELECTOR, "input[type=password]"), "the login form"
    )[0]
    field.send_keys(os.environ["PREFECT_API_AUTH_STRING"], Keys.ENTER)
    _until(driver, lambda: "/login" not in driver.current_url, "the dashboard after logging in")


def test_a_preset_launched_from_its_form_by_changing_two_fields_completes_and_shows_its_artifacts(
    deployments, warm_store, browser
):
    """The testbed preset, 2 updates instead of 1, on the site's SLURM executor: two fields changed."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from selenium.webdriver.common.by import By

    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    train, run_id = deployments[f"train/{TESTBED}"], f"ui-{uuid.uuid4().hex[:8]}"
    _log_in(browser, ui)
    browser.get(f"{ui}/deployments/deployment/{train.id}/run")
    descriptions = [RunConfig.model_fields[name].description for name in ("seed", "group_size", "store")]
    _until(browser, lambda: all(text in _body(browser) for text in descriptions), "the recipe's descriptions")
    assert "κ: pseudo-count" in _body(browser)  # nested: algo
    _give_run_id(browser, run_id)
    _type(_field(browser, "Num Updates (Optional)", "input"), "2")
    browser.save_screenshot(str(SHOTS / "train-run-form.png"))
    _submit(browser)
    flow_run_id = _until(browser, lambda: _run_of(train.id, run_id), "the new flow run (via the API)")
    run = _wait_for_end(flow_run_id)
    assert run.state.is_completed(), run.state.message
    assert warm_store.marker(run_id, 2, "checkpoint") is not None
    assert {job["update"] for job in warm_store.jobs(run_id)} == {0, 1, 2}  # SLURM jobs: the site's executor

    browser.get(f"{ui}/runs/flow-run/{flow_run_id}")
    tab = "li.p-tab#artifacts"
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, tab), "the run's Artifacts tab")[0].click()
    keys = (f"{run_id}-progress", f"{run_id}-metrics", f"{run_id}-curves", f"{run_id}-report")
    _until(browser, lambda: all(key in _body(browser) for key in keys), "the run's four artifacts")
    _until(browser, lambda: "2 of 2 updates done" in _body(browser), "the progress as updates done")
    browser.save_screenshot(str(SHOTS / "train-run-artifacts.png"))
    with get_client(sync_client=True) as client:  # one metrics table for the run, kept current in place
        versions = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{run_id}-metrics"]))
        )
    assert len(versions) == 1, [version.id for version in versions]

    recipe = deployments["train/deepseekmath-7b-sft"]  # the study's recipe: its form shows its values
    browser.get(f"{ui}/deployments/deployment/{recipe.id}/run")
    _until(browser, lambda: "Num Updates (Optional)" in _body(browser), "the 7B recipe's form")
    values = {label: _field(browser, f"{label} (Optional)", "input").get_attribute("value")
              for label in ("Num Updates", "Margin", "Prompts Per Update")}  # fmt: skip
    assert values == {"Num Updates": "1000", "Margin": "8", "Prompts Per Update": "64"}
    shown = _body(browser)  # its own model's fields only, no warm-up, on the executor it needs
    assert "Pretrained (Optional)" in shown and "resident" in shown
    assert not [label for label in ("D Model", "Vocab Size", "Modulus", "Accuracy Low") if label in shown]
    browser.save_screenshot(str(SHOTS / "train-run-form-7b.png"))


def test_the_form_refuses_a_bad_field_and_the_flow_a_cross_field_error_in_one_line(deployments, browser):
    from selenium.webdriver.common.keys import Keys

    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    train, run_id = deployments[f"train/{TESTBED}"], f"ui-bad-{uuid.uuid4().hex[:8]}"
    _log_in(browser, ui)
    browser.get(f"{ui}/deployments/deployment/{train.id}/run")
    _until(browser, lambda: "Group Size (Optional)" in _body(browser), "the run form")
    group_size = _field(browser, "Group Size (Optional)", "input")
    _type(group_size, "0")  # below its minimum: the form refuses, naming the field
    _submit(browser)
    refusal = (
        "Validation failed for field 'config.group_size'. Failure reason: 0 is less than the minimum of 1"
    )
    _until(browser, lambda: refusal in _body(browser), "the form's refusal of group_size 0")
    _type(group_size, "4")
    _give_run_id(browser, run_id)
    suffix = _field(browser, "Rescue Suffix (Optional)", "textarea")
    _type(suffix, "\\boxed{")  # the modchain task cannot tokenize it: refused when the flow run starts
    suffix.send_keys(Keys.TAB)
    _submit(browser)
    flow_run_id = _until(browser, lambda: _run_of(train.id, run_id), "the new flow run (via the API)")
    run = _wait_for_end(flow_run_id, timeout_s=120)
    line = "refused: config: algo.rescue_suffix = '\\\\boxed{' cannot be tokenized by the modchain task"
    assert run.state.is_failed() and run.state.message.startswith(line) and "\n" not in run.state.message
    browser.get(f"{ui}/runs/flow-run/{flow_run_id}")
    _until(browser, lambda: "cannot be tokenized by the modchain task" in _body(browser), "the refusal")
    browser.save_screenshot(str(SHOTS / "train-run-refused.png"))


def _give_run_id(driver, run_id: str) -> None:
    """run_id may stay empty (None): the form offers None or a string; choose a string and type it."""
    from selenium.webdriver.common.by import By

    label = "run_id (Optional)"
    _field(driver, label, "button[normalize-space()='str']").click()
    box = _until(driver, lambda: driver.find_elements(By.XPATH, _xpath(label, "textarea")), "the run_id box")
    _type(box[0], run_id)


def _type(control, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    control.send_keys(Keys.CONTROL, "a")
    control.send_keys(text)


def _submit(driver) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, "//button[@type='submit' and normalize-space()='Submit']").click()
