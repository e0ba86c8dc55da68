"""The ``factstream`` command line. Each subcommand lives in its own module
with ``register(subparsers)``; the module list below is the whole CLI.

:func:`main` is the CLI's one error boundary: a user's mistake (a database
that does not exist, a port in use, a missing certificate file, ...) becomes
one line naming what is wrong and a non-zero exit, never a traceback (those
come with ``--debug`` or ``-vv``); Ctrl-C exits 130 quietly and a closed
stdout (``| head``) ends the command quietly with status 0. Nothing printed
here, or logged, carries a password (:mod:`factstream.redaction`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit

from ..redaction import redact_text

# Subcommand modules, in the order --help lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "decode", "demo", "events-demo", "serve", "tail", "pub", "record", "status", "positions", "logs", "synapse",
)

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

# Options naming a file the command will read: checked before the command runs,
# so a typo is named instead of surfacing as a bare "No such file or directory".
FILE_OPTIONS: dict[str, str] = {
    "tls_cert": "--tls-cert", "tls_key": "--tls-key", "cafile": "--cafile", "tls_ca": "--tls-ca",
    "certfile": "--certfile", "keyfile": "--keyfile",
}


def _add_common_options(parser: argparse.ArgumentParser, suffix: str) -> None:
    """-v and --debug, accepted before and after the subcommand (dest differs so both count)."""
    default: Any = 0 if not suffix else argparse.SUPPRESS
    if "-v" not in parser._option_string_actions:  # noqa: SLF001 - argparse has no public lookup
        parser.add_argument("-v", "--verbose", dest=f"verbose{suffix}", action="count", default=default,
                            help="more logging (-vv: debug logging and tracebacks)")
    if "--debug" not in parser._option_string_actions:  # noqa: SLF001
        parser.add_argument("--debug", dest=f"debug{suffix}", action="store_true",
                            default=False if not suffix else argparse.SUPPRESS,
                            help="show the traceback of an error (for bug reports)")


class _Parser(argparse.ArgumentParser):
    """An argument parser that takes options only by their full names.

    argparse by default takes any unique prefix of an option: ``tail
    --connect HOST:PORT`` was read as ``--connect-timeout HOST:PORT`` and
    answered "invalid float value". A mistyped option is named as such
    instead. Subcommand parsers are made with this class too.
    """

    def __init__(self, *args: Any, intermixed: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        #: positionals may come after options too (``pub HOST:PORT --server-name x 'PING 1'``)
        self.intermixed = intermixed
        self._mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """A subcommand names the arguments it does not know itself, with its own usage.

        argparse leaves them to the top parser, whose usage (``factstream [-h] ... COMMAND``) and
        message (``factstream: error: ...``) do not say which command's options to look at.
        """
        if self._mixing:  # one of parse_known_intermixed_args' own passes
            return super().parse_known_args(args, namespace)
        if self.intermixed:
            self._mixing = True
            try:
                parsed, extras = self.parse_known_intermixed_args(args, namespace)
            finally:
                self._mixing = False
        else:
            parsed, extras = super().parse_known_args(args, namespace)
        if extras and " " in self.prog:  # a subcommand ("factstream tail", "factstream logs parse")
            self.error(f"unrecognized arguments: {' '.join(extras)} (see {self.prog} --help)")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """A bad value for a named option is one line naming it; other mistakes show the usage too.

        The message quotes what was typed (``unrecognized arguments: --nats
        nats://u:pw@host``), so passwords are masked in it.
        """
        message = redact_text(message)
        if message.startswith("argument "):
            self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    import factstream

    parser = _Parser(
        prog="factstream",
        description="Streams of facts and their replication between processes (Synapse-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"factstream {factstream.__version__} ({factstream.IMPL})")
    _add_common_options(parser, "")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{name.replace('-', '_')}":
                continue  # subcommand not part of this build
            raise
        module.register(subparsers)
    _add_to_subcommands(subparsers)
    return parser


def _add_to_subcommands(subparsers: Any) -> None:
    """-v/--debug on every subcommand, nested ones too (``logs parse ... -v``)."""
    for sub in list(subparsers.choices.values()):
        _add_common_options(sub, "_sub")
        for action in sub._actions:  # noqa: SLF001 - argparse has no public list of nested subparsers
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                _add_to_subcommands(action)


class RedactingFormatter(logging.Formatter):
    """Log lines with every password masked (driver errors quote connection strings).

    Tracebacks attached to a record (``log.exception``, ``exc_info=``, py4j's
    failed calls) are shown only with ``tracebacks`` (``-vv`` or ``--debug``);
    otherwise the record ends with the exception's one line, as the CLI's
    own errors do.
    """

    def __init__(self, fmt: str, *, tracebacks: bool = True) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        if self.tracebacks:
            return super().formatException(ei)
        err = ei[1]
        return f"  {type(err).__name__}: {one_line(str(err))}" if err is not None else ""

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return super().formatStack(stack_info) if self.tracebacks else ""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def one_line(text: str) -> str:
    """``text`` as a single line (driver messages span several), passwords masked."""
    return redact_text(" ".join(text.split()))


def describe_error(err: BaseException) -> str:
    """What went wrong, in one line a user can act on."""
    if isinstance(err, OSError) and err.errno == errno.EADDRINUSE:
        return f"{one_line(str(err))} (another process holds that port: stop it or choose another port)"
    if isinstance(err, OSError) and err.errno in (errno.ENOENT, errno.EACCES, errno.EISDIR) and err.filename:
        why = {errno.ENOENT: "no such file or directory", errno.EACCES: "permission denied",
               errno.EISDIR: "is a directory"}[err.errno]
        return f"{err.filename}: {why}"
    if isinstance(err, EOFError) or type(err).__name__ in ("BadGzipFile", "error") and type(err).__module__ in (
            "gzip", "zlib"):
        return f"corrupt or truncated compressed input: {one_line(str(err)) or type(err).__name__}"
    text = one_line(str(err))
    from ..errors import FactstreamError

    if isinstance(err, FactstreamError) or type(err).__module__.split(".")[0] in ("psycopg", "sqlite3", "ssl", "redis"):
        return text or type(err).__name__
    if isinstance(err, (OSError, ValueError)):
        return text or type(err).__name__
    return f"internal error: {type(err).__name__}: {text} (this is a bug: run again with --debug and report the traceback)"


def check_file_options(args: argparse.Namespace) -> str | None:
    """The first file-valued option whose file cannot be read, as a message (None: all fine)."""
    for dest, flag in FILE_OPTIONS.items():
        path = getattr(args, dest, None)
        if not isinstance(path, str) or not path:
            continue
        if not os.path.exists(path):
            return f"{flag} {path}: no such file"
        if os.path.isdir(path):
            return f"{flag} {path}: is a directory, expected a file"
        if not os.access(path, os.R_OK):
            return f"{flag} {path}: not readable (permission denied)"
    return None


def missing_sqlite(url: str, who: str) -> str | None:
    """Why a reader's ``--db`` names no database it can read (a reader never creates one), or None.

    sqlite3 creates a missing file on connect: a mistyped path would give a
    reader an empty database to wait on instead of an error. A URL written
    wrong (a bare path, ``sqlite://`` with two slashes) raises DatabaseURLError.
    """
    from ..store.database import check_url, sqlite_path

    if check_url(url) != "sqlite":  # DatabaseURLError: main() reports it as a usage mistake (exit 2)
        return None
    path = sqlite_path(url)
    if path == ":memory:":
        return "sqlite:///:memory: is always empty; give the file of a writer's database"
    if os.path.isdir(path):
        return f"{path!r} is a directory, not a database file; give the writer's --db URL"
    if not os.path.isfile(path):
        return f"no database at {path!r}{_where(path)} ({who} never creates one); {_what_to_give(path)}"
    return None


def _where(path: str) -> str:
    """Where a relative path was looked for: ``sqlite:///tmp/x.db`` names ``tmp/x.db`` in the current directory."""
    return "" if os.path.isabs(path) else f" in {os.getcwd()}"


def _what_to_give(path: str) -> str:
    """The URL of the absolute file a relative path was probably meant as (it exists), else the usual advice.

    The third slash of ``sqlite:///tmp/x.db`` ends the URL's empty host, so
    the path is relative; ``/tmp/x.db`` takes a fourth slash.
    """
    if not os.path.isabs(path) and os.path.isfile(os.sep + path):
        return f"for the file /{path}, write sqlite:////{path} (four slashes)"
    return "give the writer's --db URL"


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail on a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``factstream`` script; returns the exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    verbose = int(args.verbose) + int(getattr(args, "verbose_sub", 0))
    debug = bool(args.debug or getattr(args, "debug_sub", False) or verbose >= 2)
    args.verbose = verbose
    args.debug = debug
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", tracebacks=debug))
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), handlers=[handler])
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = f"factstream {args.command}"
    try:
        problem = check_file_options(args)
        if problem:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        silence_stdout()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return 0
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - this is the boundary: everything becomes one line
        from ..store.database import DatabaseURLError

        if isinstance(err, DatabaseURLError):  # a --db written wrong: a usage mistake, said before anything ran
            print(f"{prog}: --db: {describe_error(err)}", file=sys.stderr)
            return 2
        if debug:
            sys.stderr.write(redact_text("".join(traceback.format_exception(err))))
        try:
            print(f"{prog}: {describe_error(err)}", file=sys.stderr)
        except BrokenPipeError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
