"""autocdc's own Kafka client configured from Spark's ``kafka.`` options, secrets included.

A Kafka source is declared with Spark's options (``kafka.security.protocol``,
``kafka.sasl.*``, ``kafka.ssl.*``), which configure Java's client on the executors.
autocdc asks the same broker with librdkafka (topics, lag, the newest events), so it maps
those options to librdkafka's settings (:func:`config`): SASL PLAIN and SCRAM from the JAAS
line, the trust store (JKS and PKCS12 read with the JDK's ``keytool``, PEM as it is), a
PKCS12 or PEM client certificate, host name checking. What it cannot map (Kerberos, OAuth)
is :class:`NotAskable`: the broker is then read by Spark only, as before.

Secrets are placeholders in the option values, ``${env:NAME}`` (an environment variable)
or ``${file:PATH}`` (the file's first line), resolved when a run starts
(:func:`resolved`). What a run records about the source (the event log, which ``autocdc
status`` reads to ask the broker again) is the options as declared (:func:`recorded`):
placeholders, never their values, and no secret written as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autocdc.sources.errors import KafkaSecretError

# Spark's options that configure how its client reaches a secured broker.
SECURITY_PREFIXES = ("kafka.security.", "kafka.sasl.", "kafka.ssl.")
# An option of the source's reader that carries :func:`recorded` through the query's plan
# (Spark's Kafka source ignores options outside ``kafka.``).
RECORD_OPTION = "autocdc.kafka.client"
PLACEHOLDER = re.compile(r"\$\{(env|file):([^}]+)\}")
JAAS = "kafka.sasl.jaas.config"
# Kafka's password-typed settings: never recorded unless given by a placeholder.
_SECRET = re.compile(r"(password|jaas\.config|keystore\.key|secret)$")
_JAAS_SECRET = re.compile(r"password|secret|token", re.IGNORECASE)
_JAAS_ENTRY = re.compile(r'([\w.]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')
MECHANISMS = {
    "PLAIN": "PlainLoginModule",
    "SCRAM-SHA-256": "ScramLoginModule",
    "SCRAM-SHA-512": "ScramLoginModule",
}
JKS_MAGIC = b"\xfe\xed\xfe\xed"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_exported: dict[tuple[Any, ...], str] = {}


class NotAskable(Exception):
    """Settings autocdc's client cannot take: the broker is Spark's client's to read."""


def security(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options (names lower-cased, as Spark reads them) that secure the connection."""
    return {
        str(k).lower(): v
        for k, v in options.items()
        if str(k).lower().startswith(SECURITY_PREFIXES)
    }


def secured(options: Mapping[str, Any]) -> bool:
    return bool(security(options))


def _secret_value(kind: str, name: str, option: str) -> str:
    if kind == "env":
        if name not in os.environ:
            raise KafkaSecretError(
                option=option,
                what=f"environment variable {name}",
                problem="is not set",
                fix=f"Set {name} before the run (or give the secret in a file: ${{file:PATH}}).",
            )
        return os.environ[name]
    try:
        lines = Path(name).read_text().splitlines()
        return lines[0] if lines else ""
    except OSError as error:
        raise KafkaSecretError(
            option=option,
            what=f"file {name}",
            problem=f"cannot be read ({error.strerror or error})",
            fix="Give a readable file whose first line is the secret.",
        ) from None


def resolve(option: str, value: str) -> str:
    """``value`` with its placeholders replaced; inside a JAAS line, a value is escaped
    as the line's quoted strings need."""

    def replace(match: re.Match[str]) -> str:
        found = _secret_value(match[1], match[2], option)
        if option.lower() == JAAS:
            found = found.replace("\\", "\\\\").replace('"', '\\"')
        return found

    return PLACEHOLDER.sub(replace, value)


def resolved(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every option with its placeholders resolved: what Spark's reader is given."""
    return {k: resolve(k, v) if isinstance(v, str) else v for k, v in (options or {}).items()}


def jaas_options(line: str) -> tuple[str, dict[str, str]]:
    """A JAAS line's login module and its options (quoted values unescaped)."""
    module = line.strip().split(None, 1)[0] if line.strip() else ""
    found = {}
    for match in _JAAS_ENTRY.finditer(line):
        quoted, bare = match[2], match[3]
        found[match[1]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return module, found


def _placeholder_only(value: Any) -> bool:
    return isinstance(value, str) and PLACEHOLDER.fullmatch(value.strip()) is not None


def recorded(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The securing options as declared, fit to be written down: a secret is kept only as
    its placeholder; one written as it is becomes None (so it cannot be asked again)."""
    kept: dict[str, Any] = {}
    for name, value in security(options or {}).items():
        secret = _SECRET.search(name) is not None
        if secret and name == JAAS and isinstance(value, str):
            _, entries = jaas_options(value)
            literal = [k for k, v in entries.items() if _JAAS_SECRET.search(k)]
            secret = any(not _placeholder_only(entries[k]) for k in literal)
        elif secret:
            secret = not _placeholder_only(value)
        kept[name] = None if secret else value
    return kept


def config(options: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka's settings for Spark's securing ``options`` (resolved: no placeholders
    left); :class:`NotAskable` names what it cannot map."""
    given = security(options)
    missing = sorted(k for k, v in given.items() if v is None)
    if missing:
        raise NotAskable(f"{missing} were given as they are, not as ${{env:}} or ${{file:}}")
    protocol = str(given.get("kafka.security.protocol", "PLAINTEXT")).upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise NotAskable(f"kafka.security.protocol {protocol} is not one Kafka knows")
    settings = {"security.protocol": protocol}
    if protocol.startswith("SASL"):
        settings |= _sasl(given)
    if protocol.endswith("SSL"):
        settings |= _trust(given) | _identity(given)
        algorithm = given.get("kafka.ssl.endpoint.identification.algorithm", "https")
        settings["ssl.endpoint.identification.algorithm"] = (algorithm or "none").lower()
    return settings


def _sasl(given: Mapping[str, Any]) -> dict[str, str]:
    mechanism = str(given.get("kafka.sasl.mechanism", "GSSAPI")).upper()
    if mechanism not in MECHANISMS:
        raise NotAskable(f"SASL mechanism {mechanism} (autocdc's client takes {list(MECHANISMS)})")
    module, entries = jaas_options(str(given.get(JAAS) or ""))
    if not module.endswith(MECHANISMS[mechanism]) or "username" not in entries:
        raise NotAskable(
            f"{JAAS} is not a {MECHANISMS[mechanism]} line with a username and password"
        )
    return {
        "sasl.mechanism": mechanism,
        "sasl.username": entries["username"],
        "sasl.password": entries.get("password", ""),
    }


def _trust(given: Mapping[str, Any]) -> dict[str, str]:
    """The certificates the broker's is checked against (none: the system's)."""
    if given.get("kafka.ssl.truststore.certificates"):
        return {"ssl.ca.pem": str(given["kafka.ssl.truststore.certificates"])}
    location = given.get("kafka.ssl.truststore.location")
    if not location:
        return {}
    kind = str(given.get("kafka.ssl.truststore.type", "JKS")).upper()
    if kind == "PEM":
        return {"ssl.ca.location": str(location)}
    password = given.get("kafka.ssl.truststore.password")
    return {"ssl.ca.pem": exported(Path(str(location)), kind, password)}


def _identity(given: Mapping[str, Any]) -> dict[str, str]:
    """The client's own certificate, when the broker asks for one."""
    settings = {}
    if given.get("kafka.ssl.key.password"):
        settings["ssl.key.password"] = str(given["kafka.ssl.key.password"])
    if given.get("kafka.ssl.keystore.certificate.chain"):
        settings["ssl.certificate.pem"] = str(given["kafka.ssl.keystore.certificate.chain"])
        settings["ssl.key.pem"] = str(given.get("kafka.ssl.keystore.key") or "")
        return settings
    location = given.get("kafka.ssl.keystore.location")
    if not location:
        return settings
    kind = str(given.get("kafka.ssl.keystore.type", "JKS")).upper()
    if kind == "PEM":
        return settings | {"ssl.certificate.location": location, "ssl.key.location": location}
    try:
        with open(location, "rb") as file:
            if file.read(4) == JKS_MAGIC:
                raise NotAskable(
                    f"the keystore {location} is JKS: convert it to PKCS12 (keytool "
                    "-importkeystore -deststoretype PKCS12) for autocdc's client to read it"
                )
    except OSError as error:
        raise NotAskable(f"the keystore {location} cannot be read ({error})") from None
    password = given.get("kafka.ssl.keystore.password")
    return settings | {"ssl.keystore.location": location, "ssl.keystore.password": password or ""}


def _keytool() -> str | None:
    if "JAVA_HOME" in os.environ:
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "keytool"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("keytool")
    if found:
        return found
    java = shutil.which("java")
    beside = Path(os.path.realpath(java)).with_name("keytool") if java else None
    return str(beside) if beside and beside.is_file() else None


def exported(location: Path, kind: str, password: str | None) -> str:
    """The certificates of a JKS or PKCS12 trust store as PEM, read by the JDK's keytool
    (the reader Spark's client uses); once per process and version of the file."""
    try:
        stat = location.stat()
    except OSError as error:
        raise NotAskable(f"the trust store {location} cannot be read ({error})") from None
    digest = hashlib.sha256((password or "").encode()).hexdigest()
    key = (str(location), stat.st_mtime_ns, stat.st_size, kind, digest)
    if key in _exported:
        return _exported[key]
    keytool = _keytool()
    if keytool is None:
        raise NotAskable(
            "keytool (the JDK's) was not found to read the trust store: give it as PEM"
        )
    command = [keytool, "-list", "-rfc", "-keystore", str(location), "-storetype", kind]
    env = dict(os.environ)
    if password:
        env["AUTOCDC_KEYTOOL_STOREPASS"] = password
        command += ["-storepass:env", "AUTOCDC_KEYTOOL_STOREPASS"]
    try:
        listed = subprocess.run(
            command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NotAskable(f"keytool could not read the trust store {location} ({error})") from None
    certificates = _PEM.findall(listed.stdout)
    if listed.returncode or not certificates:
        said = (listed.stdout + listed.stderr).strip().splitlines() or ["no certificates"]
        raise NotAskable(f"keytool could not read the trust store {location} ({said[-1]})")
    _exported[key] = "\n".join(certificates) + "\n"
    return _exported[key]


def askable(record: Mapping[str, Any] | None) -> dict[str, str] | None:
    """librdkafka's settings for a source as :func:`recorded` wrote it, its placeholders
    resolved now (in this process's environment); None when it cannot be asked."""
    try:
        return config(resolved(record or {}))
    except (NotAskable, KafkaSecretError):
        return None


def record_option(options: Mapping[str, Any] | None) -> str | None:
    """What the source's reader carries as :data:`RECORD_OPTION` (None: not secured)."""
    kept = recorded(options)
    return json.dumps(kept, sort_keys=True) if kept else None
