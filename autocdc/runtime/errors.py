"""The root of every autocdc error, and the errors of starting a session.

Each layer's errors derive from :class:`AutoCdcError` through a base of their own
(:class:`SessionError` here, ``EngineError``, ``SourceError``, ``PipelineError``), so a
caller handles one layer by catching its base. The root lives in the lowest layer because
every other layer raises its subclasses.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
import string
from typing import Any, ClassVar, TypeVar

_Error = TypeVar("_Error", bound="AutoCdcError")


class AutoCdcError(Exception):
    """Base of every autocdc error; ``error_class`` is stable, ``params`` are its facts.

    Deliberately not a ``ValueError``: pydantic wraps those into a generic
    ``ValidationError``, and we want callers to catch the precise class.
    """

    error_class: ClassVar[str] = "AUTOCDC_ERROR"
    template: ClassVar[str] = "{detail}"

    def __init__(self, **params: Any) -> None:
        self.params = params
        text = self.template.format(**params)
        if "where" in params and "{where}" not in self.template:  # see located()
            flow = "" if "{flow}" in self.template else f"flow `{params['flow']}`: "
            text = f"{params['where']}: {flow}{text}"
        super().__init__(f"[{self.error_class}] {text}")

    def located(self: _Error, where: str, flow: str) -> _Error:
        """This error, of its class and code, where a pipeline declares the flow it
        concerns: ``where`` (``file:line``) and ``flow`` join its params (a ``flow`` it
        names already is kept) and lead its message."""
        return type(self)(**{"flow": flow, **self.params, "where": where})


class SessionError(AutoCdcError):
    """An error of starting a session (:mod:`autocdc.runtime`): its jars, its JVM."""


class JarsUnresolvedError(SessionError):
    error_class = "AUTOCDC_JARS_UNRESOLVED"
    template = (
        "The session's jars ({coordinate}) could not be resolved (spark-submit exited with "
        "{code}); ivy's report is in {log}. Check that Java is installed and Maven Central "
        "(repo1.maven.org) is reachable, then run `python -m autocdc.runtime.jars` again."
    )


class DeltaNotSubmittedError(SessionError):
    error_class = "AUTOCDC_DELTA_NOT_SUBMITTED"
    template = (
        "spark-submit started the JVM without Delta Lake's classes ({catalog} is not "
        "loadable), and autocdc cannot add jars to a JVM already running. Add "
        "`--packages {coordinate}` to the spark-submit command (or `--jars` with the "
        "files `python -m autocdc.runtime.jars` put in {jar_dir})."
    )


# An autocdc error raised where the driver cannot keep the object (inside a Python worker:
# a source's reader, a UDF; or by a query's ``raise_error``) reaches the driver as text
# only, in the message of the exception Spark wraps it in (PythonException,
# StreamingQueryException). An error raised on the driver, in ``foreachBatch`` too, needs
# none of this: the runner keeps the object itself (``Runner.guarded``). The two shapes
# of that text: a worker's traceback names the class and its module ...
_IN_WORKER = re.compile(r"^(autocdc(?:\.\w+)+)\.(\w+): \[(AUTOCDC_\w+)\] (.*)$", re.MULTILINE)
# ... and Spark's report of a ``raise_error`` carries only the code.
_RAISED = re.compile(
    r"\[USER_RAISED_EXCEPTION\] \[(AUTOCDC_\w+)\] (.*?)(?: SQLSTATE: \w+)?$", re.MULTILINE
)


def raised_in_worker(error: BaseException) -> AutoCdcError | None:
    """The autocdc error that ``error``'s text carries, rebuilt on the driver: the class
    its code is registered to, its message as raised, and its params read back from the
    message by the class's template (each as the text the message shows); ``None`` when
    ``error`` carries none. The one place an error crossing into the driver as text
    gets its class back."""
    text = str(error)
    if found := _IN_WORKER.findall(text):
        module, _name, error_class, message = found[-1]
        importlib.import_module(module)  # its classes registered, as in the worker
    elif found := _RAISED.findall(text):
        error_class, message = found[-1]
    else:
        return None
    cls = _with_class(AutoCdcError, error_class)
    if cls is None:
        return None
    rebuilt = cls.__new__(cls)
    Exception.__init__(rebuilt, f"[{error_class}] {message}")
    rebuilt.params = _params(cls.template, message)
    return rebuilt


def _with_class(base: type[AutoCdcError], error_class: str) -> type[AutoCdcError] | None:
    """The subclass of ``base`` (imported so far) whose ``error_class`` is ``error_class``."""
    for cls in base.__subclasses__():
        if getattr(cls, "error_class", None) == error_class:
            return cls
        if (found := _with_class(cls, error_class)) is not None:
            return found
    return None


def _params(template: str, message: str) -> dict[str, Any]:
    """The params ``template`` rendered into ``message``, as the text it shows them as (a
    ``!r`` one evaluated back); empty when the message does not fit the template."""
    pattern, names, evaluated = "", set(), set()
    for literal, name, _spec, conversion in string.Formatter().parse(template):
        pattern += re.escape(literal)
        if name is not None:
            pattern += f"(?P={name})" if name in names else f"(?P<{name}>.*?)"
            names.add(name)
            if conversion == "r":
                evaluated.add(name)
    found = re.fullmatch(pattern, message, re.DOTALL)
    if found is None:
        return {}
    params: dict[str, Any] = found.groupdict()
    for name in evaluated:
        with contextlib.suppress(ValueError, SyntaxError):
            params[name] = ast.literal_eval(params[name])
    return params
