"""Prefect's UI in a real browser (Debian's Chromium, headless, driven by Selenium with the system
chromedriver), logged in with the API's password: the train deployment's run form shows the run config's
fields with their descriptions and refuses a value out of range naming the field, a run submitted from the
form completes, and its artifacts are listed on its page. Screenshots are kept in
$PROBEPO_TEST_SCREENSHOTS (default out/ui-screenshots)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probepo.config import RunConfig
from tests.flows import NEEDS_PREFECT
from tests.flows.test_deployments import _wait_for_end
from tests.pipeline.conftest import tiny_config

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

    title = f"//span[@class='schema-form-property__label' and text()=\"{label}\"]"
    prop = "ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]"
    return driver.find_element(By.XPATH, f"{title}/{prop}//{control}")


def _log_in(driver, ui: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{ui}/login")
    field = _until(
        driver, lambda: driver.find_elements(By.CSS_SELECTOR, "input[type=password]"), "the login form"
    )[0]
    field.send_keys(os.environ["PREFECT_API_AUTH_STRING"], Keys.ENTER)
    _until(driver, lambda: "/login" not in driver.current_url, "the dashboard after logging in")


def test_a_run_started_from_the_ui_form_completes_and_shows_its_artifacts(deployments, warm_store, browser):
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    train, run_id = deployments["train"], f"ui-{uuid.uuid4().hex[:8]}"
    tiny = tiny_config(num_updates=1, store=warm_store.url)
    with get_client(sync_client=True) as client:  # the form opens on the tiny recipe, as a team's default
        client.update_deployment(
            train.id, DeploymentUpdate(parameters={"config": tiny.model_dump(mode="json")})
        )
    try:
        _log_in(browser, ui)
        browser.get(f"{ui}/deployments/deployment/{train.id}/run")
        descriptions = [RunConfig.model_fields[name].description for name in ("seed", "group_size", "store")]
        _until(
            browser,
            lambda: all(text in _body(browser) for text in descriptions),
            "the run config's descriptions",
        )
        assert "Kappa (Optional)" in _body(browser) and "κ: pseudo-count" in _body(browser)  # nested: algo
        browser.save_screenshot(str(SHOTS / "train-run-form.png"))
        run_id_box = _field(browser, "run_id", "textarea")
        run_id_box.send_keys(run_id)
        group_size = _field(browser, "Group Size (Optional)", "input")
        group_size.send_keys(Keys.CONTROL, "a")
        group_size.send_keys("0")  # below its minimum: the form refuses, naming the field
        submit = "//button[@type='submit' and normalize-space()='Submit']"
        browser.find_element(By.XPATH, submit).click()
        refusal = (
            "Validation failed for field 'config.group_size'. Failure reason: 0 is less than the minimum of 1"
        )
        _until(browser, lambda: refusal in _body(browser), "the form's refusal of group_size 0")
        browser.save_screenshot(str(SHOTS / "train-run-form-refused.png"))
        group_size.send_keys(Keys.CONTROL, "a")
        group_size.send_keys(str(tiny.group_size))
        browser.find_element(By.XPATH, submit).click()
        flow_run_id = _until(browser, lambda: _run_of(train.id, run_id), "the new flow run (via the API)")
        _until(
            browser, lambda: f"/deployments/deployment/{train.id}" in browser.current_url, "the deployment"
        )
    finally:
        with get_client(sync_client=True) as client:
            client.update_deployment(train.id, DeploymentUpdate(parameters={}))
    run = _wait_for_end(flow_run_id)
    assert run.state.is_completed(), run.state.message
    assert run.name == f"train {run_id}" and warm_store.marker(run_id, 1, "checkpoint") is not None

    browser.get(f"{ui}/runs/flow-run/{flow_run_id}")
    tab = "li.p-tab#artifacts"
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, tab), "the run's Artifacts tab")[0].click()
    keys = (f"{run_id}-progress", f"{run_id}-metrics", f"{run_id}-report")
    _until(browser, lambda: all(key in _body(browser) for key in keys), "the run's three artifacts")
    browser.save_screenshot(str(SHOTS / "train-run-artifacts.png"))
    browser.find_element(By.CSS_SELECTOR, "li.p-tab#logs").click()
    browser.save_screenshot(str(SHOTS / "train-run.png"))  # the timeline: a task run per stage
