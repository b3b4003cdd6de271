"""Where a command's logs go: the console for the person running it, a file for everything.

    logs.setup()                                # first thing in main(): nothing reaches stderr
    ...                                         # ... but this project's own lines
    logs.to_workdir(workdir, "train")           # <workdir>/logs/train.log, from here on

The console (stderr) shows what a user follows: the messages of this project and of user code
(phases, the per-iteration summary, warnings) as plain lines, written between tqdm's progress
bars so that no bar is broken, and errors from anywhere. Every record, the libraries' INFO and
warnings included (orbax writes ~45 lines per checkpoint, JAX its backend notices), goes to
``<workdir>/logs/<name>.log`` in absl's format; the records from before ``to_workdir`` (flag and
config checks, backend start-up) are kept in memory and written there first.

absl's flags bring the library logs back to the console: ``--alsologtostderr`` (console and
file), ``--logtostderr`` (console only), ``--stderrthreshold=info``, or an explicit
``--verbosity``/``-v`` (records at that level or above, on both). A library is code installed
under the interpreter's library directories (site-packages, the standard library); this package
and user code (plugins, configs) count as the project's own.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
import sysconfig
import time

from absl import flags
from absl import logging as absl_logging

from agentrl_jax.run import paths

FLAGS = flags.FLAGS
# This package's and the launchers' folders: their records are the project's own even when the
# package is installed under site-packages.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = (_PACKAGE + os.sep, os.path.join(os.path.dirname(_PACKAGE), "launch") + os.sep)
_LIBRARY = tuple(
    {
        os.path.abspath(p) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)


def is_library(pathname: str) -> bool:
    """Whether a record logged from ``pathname`` comes from an installed library."""
    path = os.path.abspath(pathname)
    if path.startswith(_OWN):
        return False
    return path.startswith(_LIBRARY) or any(
        f"{os.sep}{d}{os.sep}" in path for d in ("site-packages", "dist-packages")
    )


def _absl_prints(level: int) -> bool:
    """Whether absl's own handler writes a record of ``level`` to stderr (its flags say so)."""
    if FLAGS["logtostderr"].value or FLAGS["alsologtostderr"].value:
        return True
    return level >= absl_logging.converter.string_to_standard(FLAGS["stderrthreshold"].value)


class ConsoleHandler(logging.Handler):
    """The project's records as plain lines (``warning: ...`` above INFO) between tqdm's bars;
    a library's only from ERROR up. Records absl's flags already send to stderr are left to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _absl_prints(record.levelno):
            return False
        return record.levelno >= logging.ERROR or not is_library(record.pathname)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm.auto import tqdm  # noqa: PLC0415 - the trainer's bars are tqdm.auto's

            text = record.getMessage()
            if record.levelno > logging.INFO:
                text = f"{record.levelname.lower()}: {text}"
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            tqdm.write(text, file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


_console: ConsoleHandler | None = None
_log_path: str | None = None


def setup() -> None:
    """Keeps library logs off the console from now on (in memory until ``to_workdir``).

    Call after absl parsed the flags (in ``main``). An explicit ``--verbosity``/``-v`` without
    ``--stderrthreshold`` shows records of that level and above on the console as well.
    """
    global _console
    absl_logging.use_absl_handler()
    handler = absl_logging.get_absl_handler().python_handler
    if _log_path is None and handler.stream in (sys.stderr, sys.__stderr__):
        handler.setStream(io.StringIO())
    if FLAGS["verbosity"].present and not FLAGS["stderrthreshold"].present:
        # absl levels: -1 warning, 0 info, 1 debug (and finer vlog levels, shown as debug).
        absl_logging.set_stderrthreshold(max(-3, min(1, FLAGS.verbosity)))
    logging.captureWarnings(True)  # a library's warnings.warn goes to the file too
    if _console is None:
        _console = ConsoleHandler()
        logging.getLogger().addHandler(_console)


def to_workdir(workdir: str, name: str, process: int = 0) -> str:
    """Writes every record to ``<workdir>/logs/<name>.log`` from now on (process p > 0 of a
    multi-host run: ``<name>.p<p>.log``); returns the path. A URL workdir (``gs://``) cannot
    take a growing file: the log then goes to the local temporary folder."""
    global _log_path
    setup()
    folder = os.path.join(workdir, "logs")
    if paths.is_url(workdir):
        folder = os.path.join(os.environ.get("TMPDIR", "/tmp"), "agentrl_jax_logs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.log" if process == 0 else f"{name}.p{process}.log")
    handler = absl_logging.get_absl_handler().python_handler
    # Line-buffered: a run killed mid-way keeps its log up to the last line.
    stream = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - the log's lifetime
    stream.write(
        f"=== {' '.join(sys.argv)} on {socket.gethostname()} (pid {os.getpid()}), "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    )
    old = handler.stream
    if isinstance(old, io.StringIO):
        stream.write(old.getvalue())  # what was logged before the workdir was known
    handler.setStream(stream)
    if old is not stream and old not in (sys.stderr, sys.__stderr__, sys.stdout, sys.__stdout__):
        old.close()
    _log_path = path
    return path


def log_path() -> str | None:
    """The log file of this process (None before ``to_workdir``)."""
    return _log_path


@contextlib.contextmanager
def episode_bar(desc: str, total: int):
    """A progress bar with its ETA over ``total`` episodes of a long phase (an evaluation, the
    demonstrations, a rollout); yields its ``update`` (a worker's ``progress``). Process 0's
    only, cleared when the phase ends (the phase's own log line says what it did)."""
    import jax  # noqa: PLC0415
    from tqdm.auto import tqdm  # noqa: PLC0415 - the trainer's bars are tqdm.auto's

    primary = jax.process_index() == 0
    with tqdm(total=total, desc=desc, unit="episode", leave=False, disable=not primary) as bar:
        yield bar.update


__all__ = ["ConsoleHandler", "episode_bar", "is_library", "log_path", "setup", "to_workdir"]
