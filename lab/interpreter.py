"""Triton's interpreter, lightened for the CPU runs of the tests and the chapters (speed only, same results).

    from lab.interpreter import lighten; lighten()      # after TRITON_INTERPRET=1 is set, before any launch

Two costs of Triton 3.6's interpreter that these runs do not need (triton-viz's launch fast path takes off the
same two: triton-viz PR #407):

1. Every call of a @triton.jit helper re-patches triton.language (interpreter._patch_lang), although nothing
   undoes those patches before the launch ends: here each helper is patched on its first call in a launch.
2. The interpreter forms an int64 copy of every int32 add, sub and mul to test it for overflow (sanitize_overflow),
   then drops the result: its assert runs only in debug mode, which the interpreter never sets. Here the first
   launch of each kernel in a process runs in debug mode, so the overflow assert does fire there, and the other
   launches skip the check.
A compiled run, or another Triton version (whose internals these were not read from), is left as it is.
"""
import dataclasses
import os

PINNED = "3.6.0"


def lighten() -> bool:
    """Install both changes once per process; True when they are in place."""
    import triton
    if os.environ.get("TRITON_INTERPRET") != "1" or triton.__version__ != PINNED:
        return False
    from triton.runtime import interpreter as interp
    if getattr(interp.GridExecutor.__call__, "lightened", False):
        return True
    launch, checked = [0], set()
    run_grid = interp.GridExecutor.__call__

    def grid_call(self, *args, **kwargs):
        options, first = interp.interpreter_builder.options, self.fn not in checked
        interp.interpreter_builder.options = dataclasses.replace(options, debug=first, sanitize_overflow=first)
        checked.add(self.fn)
        launch[0] += 1
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launch[0] += 1
            interp.interpreter_builder.options = options

    def helper_call(self, *args, **kwargs):
        if getattr(self, "_patched_in_launch", None) != launch[0]:
            interp._patch_lang(self.fn)
            self._patched_in_launch = launch[0]
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    grid_call.lightened = True
    interp.GridExecutor.__call__ = grid_call
    interp.InterpretedFunction.__call__ = helper_call
    return True
