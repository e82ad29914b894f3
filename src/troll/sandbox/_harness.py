"""The program every scoring run executes inside the sandbox (its source is sent as ``python -I -S -c``).

It reads its job from stdin: one JSON line (the model's program, the kind of tests, a call's arguments, never the
expected outputs), then for stdio tests each test's input as ``<length>\n<bytes>``, read only when that test runs.
It sets the rlimits, takes private references to everything it writes with, moves the result channel off fd 1,
reports ``{"ready": 1}`` and only then runs untrusted code. It reports *values*, one JSON line per test, and the
parent compares them with the expected ones and keeps the time: a test counts only if its report arrives within
the test's time after the previous one, whatever the program does to signals, timers or exceptions, and the first
test over its time ends the run (the harness stops there, and the parent ends the run if it does not). Whatever
the model's code patches afterwards (``json``, ``print``, builtins), it can at most forge values it does not know,
or stop the reports (its tests then fail).

- ``call``: the program runs once as a module (reported as ``{"loaded": 1}``); each test calls
  ``entry_point(*input)`` under a per-test timer (a courtesy that reports the timeout; the parent's clock is the
  limit), and the return value is written by a strict serialiser that takes only exact builtin types
  (``type(x) is int`` and so on; a dict subclass as the dict it holds), so an object with an always-true
  ``__eq__`` is no value at all.
- ``stdio``: the program is compiled once (reported as ``{"loaded": 1}``); the harness makes itself non-dumpable
  (its program's processes, of the same uid, can then neither open its ``/proc`` files nor trace it; the seccomp
  filter refuses ptrace and pidfds too), and each test forks a child, which runs the program as ``__main__`` with
  a pipe on stdin fed the test's input by the harness (nothing is written to the run's files) and a pipe on
  stdout; the harness reads at most ``output`` bytes of it within its timer (the parent's clock decides which
  tests count), then kills the child's process group and reports the output.
"""

import json
import os
import resource
import select
import signal
import sys


def main(os=os, write=os.write, fork=os.fork, killpg=os.killpg, waitpid=os.waitpid, _exit=os._exit):
    job_in = Reader(os.dup(0))
    job = json.loads(job_in.line())
    for name, value in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    from _json import encode_basestring_ascii as quote

    if job["kind"] == "stdio":
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    out = os.dup(1)  # the result channel; fd 0 and 1 now lead nowhere
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)

    def report(line, out=out, write=write):
        data = (line + "\n").encode()
        while data:
            data = data[write(out, data) :]

    report('{"ready": 1}')
    try:
        code = compile(job["program"], "<program>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as err:
        report('{"syntax_error": ' + quote(type(err).__name__ + ": " + str(err)) + "}")
        _exit(0)
    if job["kind"] == "call":
        os.close(job_in.fd)
        run_calls(job, code, report, quote)
    else:
        report('{"loaded": 1}')  # compiled: the first test's time starts here
        run_stdio(job, job_in, code, report, quote, out, fork, killpg, waitpid, _exit, os)
    report('{"done": 1}')
    _exit(0)


class Reader:
    """Buffered reads of the job's descriptor: a line, or up to n bytes."""

    def __init__(self, fd):
        self.fd, self.buf = fd, bytearray()

    def line(self):
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("the job ended early")
            self.buf += chunk
        i = self.buf.index(b"\n")
        line = bytes(self.buf[:i])
        del self.buf[: i + 1]
        return line

    def read(self, n):
        if self.buf:
            data = bytes(self.buf[:n])
            del self.buf[:n]
            return data
        data = os.read(self.fd, n)
        if not data:
            raise EOFError("the job ended early")
        return data


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_calls(job, code, report, quote, setitimer=signal.setitimer, signal_=signal.signal, str_=str, type_=type):
    """Run the module, then each test; a test that raises, times out or returns no plain value fails."""
    namespace = main_module()
    timeout = job["timeout"]
    signal_(signal.SIGALRM, _alarm)
    try:
        setitimer(signal.ITIMER_REAL, timeout)
        exec(code, namespace)
    except BaseException:  # noqa: BLE001 -- sys.exit at the top level still lets the tests run
        pass
    finally:
        setitimer(signal.ITIMER_REAL, 0)
    report('{"loaded": 1}')
    function = namespace.get(job["entry_point"])
    if not callable(function):
        report('{"missing": ' + quote(str_(job["entry_point"])) + "}")
        return
    for i, args in enumerate(job["inputs"]):
        try:
            signal_(signal.SIGALRM, _alarm)
            setitimer(signal.ITIMER_REAL, timeout)
            value = function(*args)
            setitimer(signal.ITIMER_REAL, 0)
            line = f'{{"case": {i}, "value": {dump(value, quote, job["output"])}}}'
        except _Timeout:
            report(f'{{"case": {i}, "error": "timeout"}}')
            return  # the first test over its time ends the run
        except BaseException as err:  # noqa: BLE001 -- the model's exception, or SystemExit
            setitimer(signal.ITIMER_REAL, 0)
            line = f'{{"case": {i}, "error": {quote(type_(err).__name__)}}}'
        report(line)


def dump(value, quote, limit, depth=0, type_=type, repr_int=int.__repr__, repr_float=float.__repr__, len_=len):
    """JSON text of ``value`` if it is built only of exact builtin types (no subclass but of dict, no NaN); raise
    otherwise."""
    t = type_(value)
    if depth > 100:
        raise ValueError("nested too deep")
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return repr_int(value)
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("not finite")
        return repr_float(value)
    if t is str:
        return quote(value)
    if t is list or t is tuple:
        parts, size = [], 0
        for item in value:
            parts.append(dump(item, quote, limit, depth + 1))
            size += len_(parts[-1])
            if size > limit:
                raise ValueError("too large")
        return "[" + ",".join(parts) + "]"
    if issubclass(t, dict):  # Counter, defaultdict, OrderedDict: the dict they hold, not their own methods
        parts, size = [], 0
        for key, item in dict.items(value):
            if type_(key) is not str:
                raise ValueError("dict key is not a str")
            parts.append(quote(key) + ":" + dump(item, quote, limit, depth + 1))
            size += len_(parts[-1])
            if size > limit:
                raise ValueError("too large")
        return "{" + ",".join(parts) + "}"
    raise ValueError("not a plain value")


def run_stdio(job, job_in, code, report, quote, out, fork, killpg, waitpid, _exit, os):
    """Run the program once per test in a forked child fed that test's input; report what it printed."""
    for i in range(job["n"]):
        size = int(job_in.line())
        in_r, in_w = os.pipe()
        read_end, write_end = os.pipe()
        pid = fork()
        if pid == 0:  # the child: the result channel and the job closed before the program runs
            try:
                for fd in (out, job_in.fd, in_w, read_end):
                    os.close(fd)
                os.setpgid(0, 0)
                os.dup2(in_r, 0)
                os.dup2(write_end, 1)
                os.close(in_r)
                os.close(write_end)
                run_main(code)
            finally:
                _exit(1)
        os.close(in_r)
        os.close(write_end)
        data, timed_out, truncated, exited, left = exchange(job, job_in, size, in_w, read_end, pid, waitpid, os)
        while left:  # the input the program did not read: consumed, to keep the job in step
            left -= len(job_in.read(min(left, 1 << 16)))
        try:
            killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if not exited:
            waitpid(pid, 0)
        try:
            text = quote(bytes(data[: job["output"]]).decode("utf-8"))
        except UnicodeDecodeError:  # no text: the test fails
            report(f'{{"case": {i}, "error": "not_utf8"}}')
            continue
        flags = f'"timeout": {"true" if timed_out else "false"}, "truncated": {"true" if truncated else "false"}'
        report(f'{{"case": {i}, "stdout": {text}, {flags}}}')
        if timed_out:
            return  # the first test over its time ends the run


def exchange(job, job_in, size, in_w, read_end, pid, waitpid, os):
    """Feed the child ``size`` bytes of input from the job while reading its stdout, until it ends, the test's
    time passes or its output passes the cap: (output, timed_out, truncated, exited, input bytes left)."""
    import time

    cap, pending, left = job["output"], b"", size
    data, timed_out, truncated, exited = bytearray(), False, False, False
    deadline = time.monotonic() + job["timeout"]
    os.set_blocking(in_w, False)
    if not left:
        os.close(in_w)
        in_w = None
    while True:
        wait = deadline - time.monotonic()
        if wait <= 0:
            timed_out = True
            break
        if in_w is not None and not pending:
            pending = job_in.read(min(left, 1 << 16))
            left -= len(pending)
        ready, writable, _ = select.select([read_end], [in_w] if in_w is not None else [], [], min(wait, 0.05))
        if writable:
            try:
                pending = pending[os.write(in_w, pending) :]
            except BlockingIOError:
                pass
            except BrokenPipeError:  # the program stopped reading
                pending = b""
                os.close(in_w)
                in_w = None
            if in_w is not None and not pending and not left:
                os.close(in_w)
                in_w = None
        if ready:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
            if len(data) > cap:
                truncated = True
                break
        elif not writable and waitpid(pid, os.WNOHANG)[0]:  # the child left a descendant holding the pipe
            exited = True
            break
    if in_w is not None:
        os.close(in_w)
    os.close(read_end)
    return data, timed_out, truncated, exited, left


def main_module():
    """The namespace of a fresh module registered as ``__main__``, so that pickle finds the program's functions
    there (``multiprocessing.Pool`` sends them by name to its workers)."""
    import builtins
    import types

    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    return module.__dict__


def run_main(code):
    """In the child: the program as ``__main__`` with fresh text streams on fd 0 and 1, flushed at its end."""
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    status = 0
    try:
        exec(code, main_module())
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 -- the program's error: its output so far still counts
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        status = 1
    os._exit(status & 0xFF)


if __name__ == "__main__":
    main()
