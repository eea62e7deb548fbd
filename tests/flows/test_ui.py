"""Prefect's UI in a real browser (Debian's Chromium, headless, driven by Selenium with the system
chromedriver), logged in with the API's password: a preset's deployment opens its run form on the recipe,
field by field with its descriptions (the 7B recipe's on resident, the site's profile a choice, executor,
profile and store first, its groups described for its model's kind); the testbed preset launched by
changing two fields completes on the site's SLURM executor and its artifacts are listed on its page (the
metrics table's lead columns rounded, the curves over the whole run), and two nights of the nightly
evaluation list its checkpoints, the second as reused; a run shows its percent and curves while it trains,
and after a Cancel its cancelled job's task run and our line, kept after Prefect's runner has set its
own; the form refuses a value out of range naming
the field, and a cross-field error ends the flow run at once with one line shown on its page. Screenshots
(and a failed wait's page as HTML) are kept in $PROBEPO_TEST_SCREENSHOTS (default out/ui-screenshots);
docs/ui/ holds copies of those the site shows (docs/guides/prefect.md)."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flows.train import cancel_line
from probepo.config import RunConfig
from tests.flows import NEEDS_PREFECT
from tests.flows.conftest import TESTBED
from tests.flows.test_deployments import _cancelled_for_good, _wait_for_end

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
    (SHOTS / "failed.html").write_text(driver.page_source)
    raise AssertionError(f"the UI did not show {what} within {timeout_s} s (screenshots: {SHOTS})")


def _leave_the_ui(driver) -> None:
    """A blank page while the test waits on the API: a live run page redraws as it polls, in software here
    (no GPU); Chromium spent 117 CPU-s on the launch test with it open, 63 without (docs/TESTING.md)."""
    driver.get("about:blank")


def _cancel_asked(flow_run_id) -> bool:
    """Whether the run is Cancelling or Cancelled: the page's request has landed and it may be left."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state is not None and (state.is_cancelling() or state.is_cancelled())


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
    deployments, site, warm_store, browser
):
    """The testbed preset, 2 updates instead of 1, on the site's SLURM executor: two fields changed. Its
    metrics table leads with the few columns a user scans, rounded; its curves span the whole run with
    their axis ranges; two nights of the nightly evaluation list its checkpoints, the second as reused."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from selenium.webdriver.common.by import By

    from flows.deployments import load_site, site_profiles

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
    _leave_the_ui(browser)
    run = _wait_for_end(flow_run_id)
    assert run.state.is_completed(), run.state.message
    assert warm_store.marker(run_id, 2, "checkpoint") is not None
    assert {job["update"] for job in warm_store.jobs(run_id)} == {0, 1, 2}  # SLURM jobs: the site's executor

    browser.get(f"{ui}/runs/flow-run/{flow_run_id}")
    _tab(browser, "artifacts")
    keys = [f"{run_id}-{what}" for what in ("progress", "metrics", "metrics-by-stage", "curves", "report")]
    _until(browser, lambda: all(key in _body(browser) for key in keys), "the run's five artifacts")
    said = "100.0% (2 of 2 updates done)"
    _until(browser, lambda: said in _card(browser, f"{run_id}-progress"), "the progress card at 100.0%")
    browser.save_screenshot(str(SHOTS / "train-run-artifacts.png"))
    _open_artifact(browser, f"{run_id}-metrics", "wall (s)")  # the lead table: what a user scans
    shown = _body(browser)
    assert all(column in shown for column in ("update", "accuracy %", "reward", "tokens", "wall (s)"))
    assert "optimize/loss" not in shown  # every metric is in the stage table, not here
    assert _decimals(shown) and all(_significant_digits(number) <= 4 for number in _decimals(shown)), shown
    browser.save_screenshot(str(SHOTS / "train-run-metrics.png"))
    browser.get(f"{ui}/runs/flow-run/{flow_run_id}")
    _tab(browser, "artifacts")
    _open_artifact(browser, f"{run_id}-curves", "lowest ")  # the whole run, between its axis ranges
    shown = _body(browser)
    assert "held-out accuracy (%): 2 points" in shown and "mean reward: 2 points" in shown
    assert "lowest " in shown and "┤" in shown and "└" in shown
    browser.save_screenshot(str(SHOTS / "train-run-curves.png"))
    _nights_list_every_checkpoint_of_the_run(browser, ui, warm_store, run_id)
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
    labels = [label.text for label in browser.find_elements(By.CSS_SELECTOR, ".schema-form-property__label")]
    first = ["executor (Optional)", "profile (Optional)", "run_id (Optional)", "config", "Store (Optional)"]
    assert labels[: len(first)] == first, labels[:10]
    # the site's executor (slurm) cannot run its checkpoint_every 10: it opens on resident
    assert _chosen(_field(browser, "executor (Optional)", "select")) == "resident"
    profile = _field(browser, "profile (Optional)", "select")  # a choice of the site's profiles
    offered = [option.get_attribute("value") for option in profile.find_elements(By.TAG_NAME, "option")]
    assert offered == site_profiles(*load_site(site)) and _chosen(profile) == offered[0]
    chosen_kind = _field(browser, "profile (Optional)", "button[@aria-selected='true']")
    assert chosen_kind.text == "the site's"
    shown = _body(browser)  # its own model's fields only, no warm-up
    assert "Pretrained (Optional)" in shown
    assert not [label for label in ("D Model", "Vocab Size", "Modulus", "Accuracy Low") if label in shown]
    # its Model group described for a Hugging Face model; a `<placeholder>` of a docstring shown as written
    assert "The policy: a Hugging Face causal language model, from its pretrained weights" in shown
    assert "testbed GPT" not in shown and "<benchmarks_root>/math_train/train.jsonl" in shown
    browser.save_screenshot(str(SHOTS / "train-run-form-7b.png"))
    model_group = browser.find_element(By.XPATH, "//*[contains(text(), 'Hugging Face causal language')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", model_group)
    browser.save_screenshot(str(SHOTS / "train-run-form-7b-model.png"))


def test_a_run_shows_its_percent_and_curves_while_it_trains_and_its_cancelled_jobs_after_a_cancel(
    deployments, warm_store, profile_path, browser, tmp_path
):
    """Three updates on the SLURM executor, update 1's sample job held before its commit: while it trains,
    the run's page shows its progress card at 33.3% (1 of 3 updates done) and its curves; cancelled from
    the page, it shows the held job's task run Cancelled, naming the job, and our line (what ended, which
    jobs, how to go on) as its final state message, after Prefect's runner has set its own; its log says
    why Prefect logs the cancelled task run at ERROR."""
    from prefect import get_client
    from selenium.webdriver.common.by import By

    from tests.flows.test_deployments import _wait_until
    from tests.slurm.conftest import drill_config

    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    train, run_id = deployments[f"train/{TESTBED}"], f"ui-cancel-{uuid.uuid4().hex[:8]}"
    config = drill_config(store=warm_store.url, num_updates=3)
    paused, release = tmp_path / "paused", tmp_path / "release"  # never released: the cancel ends the job
    hold = {"PROBEPO_PAUSE_AT": "1:sample:before-commit", "PROBEPO_PAUSE_MARK": str(paused),
            "PROBEPO_PAUSE_RELEASE": str(release)}  # fmt: skip
    parameters = {"config": config.model_dump(mode="json"), "run_id": run_id, "executor": "slurm",
                  "profile": str(profile_path)}  # fmt: skip
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            train.id, parameters=parameters, job_variables={"env": hold}
        )
    _wait_until(paused.exists)
    [held] = warm_store.jobs(run_id, 1, "sample")

    _log_in(browser, ui)
    browser.get(f"{ui}/runs/flow-run/{created.id}")
    _tab(browser, "artifacts")
    progress = f"{run_id}-progress"
    said = "33.3% (1 of 3 updates done)"  # the card's own line: Prefect's rendering shows only "33%"
    _until(browser, lambda: said in _card(browser, progress), f"the progress card at {said}")
    assert f"{run_id}-curves" in _body(browser)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(created.id).state.is_running()  # all this while it trains
    browser.save_screenshot(str(SHOTS / "train-run-training.png"))
    _cards(browser)[f"{run_id}-curves"].click()  # the chart, drawn from update 0 so far
    _until(browser, lambda: "mean reward: 1 point" in _body(browser), "the curves")

    browser.get(f"{ui}/runs/flow-run/{created.id}")  # the UI's Cancel, then its confirmation
    _button(browser, "Cancel").click()
    _button(browser, "Confirm").click()
    _until(browser, lambda: _cancel_asked(created.id), "the run Cancelling (via the API)")
    _leave_the_ui(browser)
    run = _cancelled_for_good(created.id)  # Prefect's runner set its generic line, then ours came back
    job = str(held["job_id"])
    line = cancel_line(run_id, None, [job])
    assert run.state.is_cancelled() and run.state.message == line, run.state
    assert line.endswith(f"; to go on, run the resume deployment with run_id {run_id}")
    browser.get(f"{ui}/runs/flow-run/{created.id}")
    _tab(browser, "details")
    said = f"run {run_id} cancelled; jobs ended: {job}; "  # what the page shows before its "See More"
    _until(
        browser, lambda: _detail(browser, "State Message").startswith(said), "our line as the state message"
    )
    browser.find_element(
        By.CSS_SELECTOR, ".p-text-truncate--action-text"
    ).click()  # "See More": the whole line
    _until(browser, lambda: _detail(browser, "State Message") == f"{line} See Less", "our whole line")
    browser.save_screenshot(str(SHOTS / "train-run-cancelled-run.png"))
    _tab(browser, "logs")  # the ERROR Prefect's task engine logs for the cancelled job, explained after it
    _until(browser, lambda: "Finished in state Cancelled" in _body(browser), "the task run's ERROR line")
    _until(browser, lambda: "its level for every end but Completed; nothing failed" in _body(browser), "why")
    _tab(browser, "task-runs")
    task = f"sample · update 1 · job {job}"
    _until(browser, lambda: task in _body(browser), "the held job's task run")
    assert _task_run_state(browser, task) == "Cancelled"
    browser.find_element(By.PARTIAL_LINK_TEXT, task).click()
    _until(browser, lambda: f"job {job} cancelled with the run" in _body(browser), "its state message")
    browser.save_screenshot(str(SHOTS / "train-run-cancelled.png"))


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


def _nights_list_every_checkpoint_of_the_run(driver, ui: str, store, run_id: str) -> None:
    """Two nights of the nightly evaluation on the finished run, in the worker's process: the first takes
    the run's own evaluations of policies 0 and 2 and makes policy 1's; the second does nothing, yet its
    table lists all three as reused, and its cost line names the executor."""
    from flows.evaluate import nightly_eval
    from probepo.config import CheckpointSelection

    _leave_the_ui(driver)
    nights = [
        nightly_eval(
            store.url, selection=CheckpointSelection(runs=(run_id,)), executor="inline", return_state=True
        )
        for _ in range(2)
    ]
    assert [night.result() for night in nights] == [
        {"evaluated": 1, "resumed": 0, "reused": 2, "exists": 0, "failed": 0},
        {"evaluated": 0, "resumed": 0, "reused": 3, "exists": 0, "failed": 0},
    ]
    driver.get(f"{ui}/runs/flow-run/{nights[1].state_details.flow_run_id}")
    _tab(driver, "artifacts")
    cost = "executor inline: no jobs, every pair in the worker's process (no GPU-hours)"
    _until(driver, lambda: cost in _card(driver, "nightly-eval-evaluations"), "the night's cost line")
    _open_artifact(driver, "nightly-eval-evaluations", "reused")
    _until(driver, lambda: _body(driver).count("reused") == 3, "the three checkpoints, reused")
    driver.save_screenshot(str(SHOTS / "nightly-eval-table.png"))


def _open_artifact(driver, key: str, showing: str) -> None:
    """Open the artifact card `key` of the run page's artifacts tab, and wait for its page to show
    `showing`."""
    _until(driver, lambda: key in _cards(driver), f"the {key} card")
    _cards(driver)[key].click()
    _until(driver, lambda: showing in _body(driver), f"the {key} artifact's page")


def _decimals(text: str) -> list[str]:
    """The decimal numbers shown in `text` (not times, dates or ids)."""
    return re.findall(r"(?<![\w.:/-])-?\d+\.\d+(?![\w.:/-])", text)


def _significant_digits(number: str) -> int:
    return len(number.lstrip("-").replace(".", "").lstrip("0"))


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


def _tab(driver, name: str) -> None:
    """Open the run page's tab `name` (artifacts, task-runs, ...)."""
    from selenium.webdriver.common.by import By

    tab = f"li.p-tab#{name}"
    _until(driver, lambda: driver.find_elements(By.CSS_SELECTOR, tab), f"the run's {name} tab")[0].click()


def _cards(driver) -> dict[str, object]:
    """The artifact cards shown, by key."""
    from selenium.webdriver.common.by import By

    titles = driver.find_elements(By.CSS_SELECTOR, ".artifact-card .artifact-card__title")
    card = "ancestor::*[contains(concat(' ', @class, ' '), ' artifact-card ')][1]"
    return {title.text: title.find_element(By.XPATH, card) for title in titles}


def _card(driver, key: str) -> str:
    """The text of the artifact card of `key` ("" while there is none)."""
    card = _cards(driver).get(key)
    return card.text if card is not None else ""


def _chosen(select) -> str:
    from selenium.webdriver.support.select import Select

    return Select(select).first_selected_option.get_attribute("value")


def _button(driver, text: str):
    from selenium.webdriver.common.by import By

    path = f"//button[normalize-space()='{text}']"
    return _until(driver, lambda: driver.find_elements(By.XPATH, path), f"the {text} button")[0]


def _task_run_state(driver, name: str) -> str:
    """The state badge of the task run named `name` in the run page's list."""
    from selenium.webdriver.common.by import By

    item = "ancestor::*[contains(concat(' ', @class, ' '), ' task-run-list-item ')][1]"
    row = driver.find_element(By.PARTIAL_LINK_TEXT, name).find_element(By.XPATH, item)
    return row.find_element(By.CSS_SELECTOR, ".state-badge").text


def _detail(driver, label: str) -> str:
    """The value of the run page's detail `label` ("" while it is not shown)."""
    from selenium.webdriver.common.by import By

    path = (
        f"//*[contains(@class, 'p-key-value__label') and normalize-space()='{label}']/following-sibling::*[1]"
    )
    return next((found.text for found in driver.find_elements(By.XPATH, path)), "")
