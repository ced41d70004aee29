"""Entry point of the copies of the user's program that ``SubprocessScriptLauncher`` starts:

    python .../fullshard/launch/rerun_main.py SCRIPT [ARGS...]
    python .../fullshard/launch/rerun_main.py -m MODULE [ARGS...]

It runs the program as ``python SCRIPT ARGS`` (``python -m MODULE ARGS``) would and then leaves
as [Note: a launched copy leaves with os._exit] describes. It is started by path and imports only
the standard library, so the program starts as it would on its own, with its own imports in its
own order (a program may set environment variables before it imports torch).

[Note: a launched copy leaves with os._exit]
A gloo process group runs each collective on one of its worker threads. The caller's ``wait()``
returns once the work is marked complete; the worker drops its reference to the work a moment
later, and when the work's tensors are visible from Python that takes the GIL (torch drops the
tensor's Python object: ``TensorImpl::decref_pyobject``). If the interpreter has begun to
finalize by then, CPython before 3.14 ends the thread with ``pthread_exit``, whose unwinding meets
a ``noexcept`` destructor: ``std::terminate`` ("terminate called without an active exception"),
SIGABRT, exit 134, after a program that had finished. A core dump shows exactly that stack
(``ProcessGroupGloo::runLoop`` > ``~AsyncAllreduceWork`` > ``decref_pyobject`` > ``take_gil`` >
``pthread_exit``); pytorch/pytorch#179291 describes it; python/cpython#87135 hangs such a thread
instead from 3.14, which would turn the crash into a hang of the process group's destructor. A
worker is that late only when it was starved of CPU from the collective's end to the interpreter's
exit: rare on a loaded machine, certain in tests/scripts/teardown_job.py.

fullshard cannot make every worker finish first: only the process group's destructor joins them
(``shutdown()`` and ``abort()`` leave them running, a barrier waits for earlier work to complete,
not to be dropped), and the modules DDP and FSDP wrapped keep the group alive until finalization
itself. So a copy started by the launcher never finalizes its interpreter. After the program ends
it does what ``python`` does before finalizing, in the same order: print an uncaught exception's
traceback, wait for non-daemon threads, run the ``atexit`` functions (the process group teardown
among them, see [Note: process group teardown] in fullshard.strategies.parallel); then it flushes
what finalization would have flushed (open Python files, ``sys.stdout``/``sys.stderr``, C stdio)
and ends with ``os._exit``. The status is the one ``python`` would have given, known exactly
because this module runs the program itself (:func:`exit_status`): 0 when it returns,
``SystemExit``'s code, 1 after an uncaught exception, death by SIGINT after an uncaught
``KeyboardInterrupt``, 120 when flushing ``sys.stdout`` fails. A copy gives up only what
finalization alone does: ``__del__`` of objects still alive at exit, C++ static destructors.

Rank 0 is the user's own process and finalizes as usual; it destroys the group only after its
copies have exited, which leaves its own workers that long to finish. Processes that torchrun or
SLURM start are the user's too, and keep python's own exit.
"""

from __future__ import annotations

import sys

_SAFE_PATH = getattr(sys.flags, "safe_path", False)  # python -P (3.11+): no sys.path[0] at all
if __name__ == "__main__" and not _SAFE_PATH:
    del sys.path[0]  # this file's directory: the program's own goes there (see _set_path0)

# Imported after that, so that nothing can be imported from this file's directory.
import atexit  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402
from typing import NoReturn  # noqa: E402

# The status that stands for "end by SIGINT", as python does after an uncaught KeyboardInterrupt.
DIE_BY_SIGINT = -int(signal.SIGINT)
_FLUSH_FAILED = 120  # python's exit status when flushing sys.stdout or sys.stderr fails


def exit_status(error: BaseException | None) -> int:
    """The exit status ``python`` gives a program that ended with ``error`` (None: it returned).

    A status in 0..255, or :data:`DIE_BY_SIGINT`. Like python, it prints a ``SystemExit`` code that
    is not an integer to ``sys.stderr``; tracebacks are printed by :func:`report_uncaught`.
    """
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        code = error.code
        if code is None:
            return 0
        if isinstance(code, int):
            # python passes it to exit() as a C long cast to int: the OS keeps the low 8 bits.
            return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
        print(code, file=sys.stderr if sys.stderr is not None else sys.__stderr__)
        return 1
    if isinstance(error, KeyboardInterrupt):
        return DIE_BY_SIGINT
    return 1


def report_uncaught(error: BaseException, skip_file: str) -> None:
    """Print ``error`` as python prints an uncaught exception, without the frames of ``skip_file``
    at the top of its traceback (this module's, which python's own runner does not show)."""
    if isinstance(error, SystemExit):
        return
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == skip_file:
        tb = tb.tb_next
    error = error.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    try:
        sys.excepthook(type(error), error, tb)
    except BaseException:  # a broken hook must not hide the program's own error
        sys.__excepthook__(type(error), error, tb)


def _flush_open_files() -> None:
    """Flush the Python files that finalization would have flushed while closing them."""
    import gc

    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    # type(), not isinstance(): some objects warn or fail when asked for their __class__.
    files = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
    # Text files first: they pass their text on to a binary buffer that is flushed next.
    for file in sorted(files, key=lambda f: not isinstance(f, io.TextIOWrapper)):
        try:
            if not file.closed:
                file.flush()
        except Exception:  # finalization ignores these too
            pass


def _flush_c_stdio() -> None:
    """Flush C stdio buffers (output of C/C++ code), which exit() would have flushed."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # no C library to flush (Windows)
        pass


def leave(status: int) -> NoReturn:
    """End this process with ``status`` (see :func:`exit_status`) the way [Note: a launched copy
    leaves with os._exit] describes."""
    # What Py_FinalizeEx does before it finalizes: wait for the non-daemon threads, then run the
    # atexit functions. Both functions are private, but they are what the interpreter itself
    # calls (multiprocessing's forked children also end with threading._shutdown and os._exit).
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
        except Exception:  # python's own exit status for this, 120, replaces the program's
            if status != DIE_BY_SIGINT:
                status = _FLUSH_FAILED
    _flush_c_stdio()
    if status == DIE_BY_SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + int(signal.SIGINT)  # if the signal did not end us
    os._exit(status)


def _set_path0(entry: str) -> None:
    if not _SAFE_PATH:
        sys.path.insert(0, entry)


def _fresh_main(**attributes: object) -> types.ModuleType:
    """A new ``__main__`` module for the program (this one's namespace stays out of its way)."""
    import builtins

    main = types.ModuleType("__main__")
    vars(main).update(__builtins__=builtins, **attributes)
    sys.modules["__main__"] = main
    return main


def run_program(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``python`` would (it may raise anything)."""
    import runpy

    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]  # runpy puts the module's path in sys.argv[0], as python does
        _set_path0(os.getcwd())
        _fresh_main()
        # python -m runs exactly this; runpy.run_module would run the module in a temporary one.
        runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]
        return
    script = argv[0]
    sys.argv = list(argv)
    if os.path.isdir(script) or script.endswith((".zip", ".pyz")):  # python runs its __main__
        sys.path.insert(0, script)
        _fresh_main()
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    from importlib.machinery import SourceFileLoader

    _set_path0(os.path.dirname(os.path.realpath(script)))
    main = _fresh_main(__file__=script, __cached__=None, __loader__=SourceFileLoader("__main__", script))
    with io.open_code(script) as file:
        code = compile(file.read(), script, "exec", dont_inherit=True)
    exec(code, vars(main))


def main() -> NoReturn:
    error: BaseException | None = None
    try:
        run_program(sys.argv[1:])
    except BaseException as caught:  # the program's end, whatever it is, decides the status
        error = caught
    if error is not None:
        report_uncaught(error, skip_file=__file__)
    leave(exit_status(error))


if __name__ == "__main__":
    main()
