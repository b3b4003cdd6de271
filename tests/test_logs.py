"""Which records reach the console and which only the log file (run/logs.py); the whole
path, a real run's console and its WORKDIR/logs/train.log, is checked in tests/test_train.py."""

import logging
import os

import orbax.checkpoint
import pytest
from absl import logging as absl_logging
from absl.testing import flagsaver

from agentrl_jax.run import logs, trainer


def _record(pathname: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("absl", level, pathname, 1, "a message", (), None)


def test_libraries_are_installed_code_and_the_project_is_not():
    assert logs.is_library(orbax.checkpoint.__file__)
    assert logs.is_library(absl_logging.__file__)
    assert logs.is_library(os.__file__)  # the standard library
    assert not logs.is_library(trainer.__file__)
    launcher = os.path.join(os.path.dirname(os.path.dirname(__file__)), "launch", "train.py")
    assert not logs.is_library(launcher)
    assert not logs.is_library("/home/me/plugins/custom_rl.py")  # a user's plugin


@pytest.mark.parametrize(
    "source, level, shown",
    [
        ("library", logging.INFO, False),
        ("library", logging.WARNING, False),
        ("library", logging.ERROR, True),
        ("own", logging.INFO, True),
        ("own", logging.WARNING, True),
    ],
)
def test_the_console_shows_the_projects_records_and_library_errors(source, level, shown):
    path = orbax.checkpoint.__file__ if source == "library" else trainer.__file__
    assert logs.ConsoleHandler().filter(_record(path, level)) is shown


def test_absl_flags_that_print_to_stderr_take_the_console_over():
    console = logs.ConsoleHandler()
    own = _record(trainer.__file__)
    for flag in ("alsologtostderr", "logtostderr"):
        with flagsaver.flagsaver(**{flag: True}):
            assert logs._absl_prints(logging.INFO)
            assert not console.filter(own)  # absl prints it (in its format): not twice
    with flagsaver.flagsaver(stderrthreshold="warning"):
        assert logs._absl_prints(logging.WARNING) and not logs._absl_prints(logging.INFO)
        assert console.filter(own) and not console.filter(_record(trainer.__file__, 30))
