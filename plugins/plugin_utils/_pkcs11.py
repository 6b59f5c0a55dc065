# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The root secrets file wrapped by a non-extractable AES key inside a PKCS#11 token (AES-256-GCM on the token).

The wrapped file names where its key lives (module path, token label, key label) and where the PIN comes from (an
environment variable or a 0600 file, never argv, never the file itself); none of that is secret. The header is the
GCM additional data, so a changed header or ciphertext fails authentication on the token. ``python-pkcs11`` is imported
only here, only when a wrapped file is read or written: a controller without it loses nothing else.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass

WRAPPED = "pkcs11_wrapped"
AAD_LABEL = "confidential.kubernetes/pkcs11-wrap/v1"
GCM_NONCE_BYTES = 12
MAX_PIN_BYTES = 1024


class Pkcs11Error(RuntimeError):
    """The token, its key, its PIN or the wrapped file is wrong; the message says which (never the PIN)."""


@dataclass(frozen=True)
class Custody:
    module: str
    token_label: str
    key_label: str
    pin_env: str | None = None
    pin_file: str | None = None

    def __post_init__(self) -> None:
        # Plain str: Ansible hands over tagged strings, which the PKCS#11 binding refuses.
        for name in ("module", "token_label", "key_label", "pin_env", "pin_file"):
            value = getattr(self, name)
            object.__setattr__(self, name, str(value) if value else None)

    def header(self) -> dict:
        return dict(
            module=self.module,
            token_label=self.token_label,
            key_label=self.key_label,
            pin_env=self.pin_env,
            pin_file=self.pin_file,
        )

    def aad(self) -> bytes:
        return json.dumps([AAD_LABEL, self.header()], sort_keys=True).encode()

    @classmethod
    def from_header(cls, header: object, source: str) -> Custody:
        if not isinstance(header, dict) or not all(
            isinstance(header.get(name), str) and header.get(name) for name in ("module", "token_label", "key_label")
        ):
            raise Pkcs11Error(f"{source}: the PKCS#11 header must name module, token_label and key_label")
        return cls(
            header["module"], header["token_label"], header["key_label"], header.get("pin_env"), header.get("pin_file")
        )

    def pin(self) -> str:
        if self.pin_env:
            value = os.environ.get(self.pin_env)
            if not value:
                raise Pkcs11Error(
                    f"the PKCS#11 PIN is read from the environment variable {self.pin_env}, which is unset"
                )
            return value
        if self.pin_file:
            path = os.path.expanduser(self.pin_file)
            try:
                if os.stat(path).st_mode & 0o077:
                    raise Pkcs11Error(f"PKCS#11 PIN file {path} must not be readable by group or others (chmod 600)")
                with open(path, "rb") as handle:
                    return handle.read(MAX_PIN_BYTES).decode().strip()
            except OSError as exc:
                raise Pkcs11Error(f"cannot read PKCS#11 PIN file {path}: {exc.strerror}") from None
        raise Pkcs11Error("no PKCS#11 PIN source: give pin_env (an environment variable's name) or pin_file")


def _pkcs11():
    try:
        import pkcs11  # noqa: PLC0415 - lazily: only sites that keep the secrets in a token need python-pkcs11
        from pkcs11.mechanisms import GCMParams  # noqa: PLC0415
    except ImportError:
        raise Pkcs11Error(
            "the secrets are wrapped by a PKCS#11 key, but python-pkcs11 is not installed on the controller "
            "(pip install 'python-pkcs11>=0.10,<0.11')"
        ) from None
    return pkcs11, GCMParams


def _with_key(custody: Custody, operation):
    pkcs11, params = _pkcs11()
    try:
        library = pkcs11.lib(custody.module)
    except (OSError, RuntimeError, pkcs11.exceptions.PKCS11Error) as exc:
        raise Pkcs11Error(f"cannot load the PKCS#11 module {custody.module}: {type(exc).__name__}") from None
    try:
        token = library.get_token(token_label=custody.token_label)
    except pkcs11.exceptions.NoSuchToken:
        raise Pkcs11Error(f"no PKCS#11 token labelled {custody.token_label!r} in {custody.module}") from None
    except pkcs11.exceptions.MultipleTokensReturned:
        raise Pkcs11Error(f"more than one PKCS#11 token is labelled {custody.token_label!r}") from None
    try:
        with token.open(user_pin=custody.pin()) as session:
            try:
                key = session.get_key(
                    object_class=pkcs11.ObjectClass.SECRET_KEY, key_type=pkcs11.KeyType.AES, label=custody.key_label
                )
            except pkcs11.exceptions.NoSuchKey:
                raise Pkcs11Error(
                    f"no AES key labelled {custody.key_label!r} on token {custody.token_label!r}"
                ) from None
            except pkcs11.exceptions.MultipleObjectsReturned:
                raise Pkcs11Error(f"more than one AES key is labelled {custody.key_label!r}") from None
            if key[pkcs11.Attribute.EXTRACTABLE] or not key[pkcs11.Attribute.SENSITIVE]:
                raise Pkcs11Error(
                    f"the AES key {custody.key_label!r} on token {custody.token_label!r} is extractable or not "
                    "sensitive: its value can leave the token, so it guards nothing; make a non-extractable one"
                )
            return operation(key, pkcs11, params)
    except pkcs11.exceptions.PinIncorrect:
        raise Pkcs11Error(f"the PIN of PKCS#11 token {custody.token_label!r} is wrong") from None
    except pkcs11.exceptions.PinLocked:
        raise Pkcs11Error(f"the PIN of PKCS#11 token {custody.token_label!r} is locked") from None


def wrap(plain: bytes, custody: Custody) -> bytes:
    """The wrapped secrets file's content: ``plain`` (the secrets document) encrypted on the token."""
    nonce = os.urandom(GCM_NONCE_BYTES)

    def encrypt(key, pkcs11, params):
        return key.encrypt(plain, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params(nonce, custody.aad(), 128))

    ciphertext = _with_key(custody, encrypt)
    document = {
        WRAPPED: dict(
            custody.header(),
            nonce=base64.b64encode(nonce).decode(),
            ciphertext=base64.b64encode(ciphertext).decode(),
        )
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def is_wrapped(document: object) -> bool:
    return isinstance(document, dict) and WRAPPED in document


def unwrap(document: dict, source: str) -> bytes:
    """The secrets document inside a wrapped file's ``document``, decrypted on the token, in memory."""
    body = document.get(WRAPPED)
    custody = Custody.from_header(body, source)
    try:
        nonce = base64.b64decode(body.get("nonce", ""), validate=True)
        ciphertext = base64.b64decode(body.get("ciphertext", ""), validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise Pkcs11Error(f"{source}: nonce or ciphertext is not base64") from None
    if len(nonce) != GCM_NONCE_BYTES:
        raise Pkcs11Error(f"{source}: the nonce must be {GCM_NONCE_BYTES} bytes")

    def decrypt(key, pkcs11, params):
        try:
            return key.decrypt(
                ciphertext, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params(nonce, custody.aad(), 128)
            )
        except pkcs11.exceptions.PKCS11Error:
            raise Pkcs11Error(
                f"{source} fails authentication on token {custody.token_label!r}: the file was changed, or it was "
                f"wrapped by another key labelled {custody.key_label!r}"
            ) from None

    return _with_key(custody, decrypt)
