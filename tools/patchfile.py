"""Parse a patch file: the mail header git format-patch writes, our DEP-3-like fields, and the hunks.

The header is kept byte for byte (``Patch.header``); fields are read from it but never re-rendered,
so free text such as ``Anchors:`` lines survives refresh untouched.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.header import decode_header, make_header
from pathlib import Path

import unidiff

from tools.errors import PatchParseError

REQUIRED_FIELDS = ("Subject", "Description", "Applies-To", "Upstream-Status", "Drop-When", "Tests")
UPSTREAM_STATUS_RE = re.compile(
    r"^(not upstream|submitted \S+|upstream since v\S+|obsolete since v\S+( \(.+\))?)$"
)
_FIELD_RE = re.compile(r"^([A-Z][A-Za-z0-9-]*):(.*)$")
_DIFF_START_RE = re.compile(r"^diff --git ", re.M)


@dataclass(frozen=True)
class HunkLine:
    kind: str  # " ", "-", "+"
    text: str  # with its line ending; no ending where the patch says "\ No newline at end of file"


@dataclass(frozen=True)
class Hunk:
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    header: str  # "@@ -a,b +c,d @@ section"
    lines: tuple[HunkLine, ...]

    @property
    def old_lines(self) -> list[str]:
        return [ln.text for ln in self.lines if ln.kind in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [ln.text for ln in self.lines if ln.kind in " +"]


@dataclass(frozen=True)
class FilePatch:
    source: str | None  # path without a/ prefix; None for a created file
    target: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]
    is_binary: bool = False
    old_blob: str | None = None
    new_blob: str | None = None

    @property
    def path(self) -> str:
        return self.target or self.source or "?"

    @property
    def is_rename(self) -> bool:
        return self.source is not None and self.target is not None and self.source != self.target


@dataclass(frozen=True)
class Patch:
    name: str
    header: str  # everything before the diff, byte for byte (incl. the "---" separator)
    fields: dict[str, str] = field(hash=False, compare=False)
    files: tuple[FilePatch, ...] = ()

    @property
    def subject(self) -> str:
        return self.fields.get("Subject", "")

    @property
    def tests(self) -> list[str]:
        return self.fields.get("Tests", "").split()

    @property
    def applies_to(self) -> list[str]:
        return [v.strip() for v in re.split(r"[,\s]+", self.fields.get("Applies-To", "")) if v.strip()]

    @property
    def upstream_status(self) -> str:
        return self.fields.get("Upstream-Status", "")

    def missing_fields(self) -> list[str]:
        return [f for f in REQUIRED_FIELDS if not self.fields.get(f, "").strip()]

    def header_problems(self) -> list[str]:
        probs = [f"{self.name}: header lacks required field {f}:" for f in self.missing_fields()]
        us = self.upstream_status
        if us and not UPSTREAM_STATUS_RE.match(us):
            probs.append(
                f"{self.name}: Upstream-Status {us!r} is not one of 'not upstream', 'submitted <URL>', "
                "'upstream since vX', 'obsolete since vX (<why>)'"
            )
        for t in self.tests:
            if "::" not in t and not t.endswith(".py"):
                probs.append(f"{self.name}: Tests entry {t!r} is not a pytest node id (path.py::name)")
        return probs


def _parse_mail_header(head: str) -> dict[str, str]:
    """RFC 822 headers (folded lines joined) then ``Field: value`` lines of the body.

    Body fields continue on lines that start with a space (Debian control style, DEP-3);
    a continuation line " ." stands for an empty line.
    """
    fields: dict[str, str] = {}
    lines = head.split("\n")
    i = 0
    if lines and lines[0].startswith("From "):
        i = 1
    cur: str | None = None
    while i < len(lines) and lines[i] != "":
        ln = lines[i]
        if ln[:1] in (" ", "\t") and cur:
            fields[cur] += " " + ln.strip()
        else:
            m = re.match(r"^([A-Za-z-]+):\s?(.*)$", ln)
            if m:
                cur = m.group(1)
                fields[cur] = m.group(2)
        i += 1
    if "Subject" in fields:
        subj = str(make_header(decode_header(fields["Subject"])))
        fields["Subject"] = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subj)
    cur = None
    body: dict[str, list[str]] = {}
    for ln in lines[i + 1 :]:
        if ln == "---":
            break
        m = _FIELD_RE.match(ln)
        if m:
            cur = m.group(1)
            body[cur] = [m.group(2).strip()]
        elif ln.startswith(" ") and cur:
            body[cur].append("" if ln.strip() == "." else ln[1:])
        else:
            cur = None  # free text ends a field
    for k, parts in body.items():
        fields[k] = "\n".join(parts).strip("\n")
    return fields


def _hunk_from_unidiff(h: unidiff.Hunk) -> Hunk:
    out: list[HunkLine] = []
    for ln in h:
        if ln.line_type == "\\":
            if out:
                prev = out[-1]
                out[-1] = HunkLine(prev.kind, prev.text[:-1] if prev.text.endswith("\n") else prev.text)
            continue
        out.append(HunkLine(ln.line_type, ln.value))
    header = f"@@ -{h.source_start},{h.source_length} +{h.target_start},{h.target_length} @@"
    if h.section_header:
        header += " " + h.section_header
    return Hunk(h.source_start, h.source_length, h.target_start, h.target_length, header, tuple(out))


def _strip(p: str) -> str | None:
    if p in ("/dev/null", None):
        return None
    return p[2:] if p[:2] in ("a/", "b/") else p


def parse_patch_text(text: str, name: str = "<patch>") -> Patch:
    if "\r\n" in text and all(
        ln.endswith("\r") for ln in text.split("\n")[:5] if ln
    ):
        raise PatchParseError(
            f"{name}: the file has CRLF (Windows) line endings throughout, so its header and "
            "context cannot match upstream's LF files. Convert it (e.g. `dos2unix patches/"
            f"{name}` or `sed -i 's/\\r$//'`) and run `make check`."
        )
    m = _DIFF_START_RE.search(text)
    if not m:
        raise PatchParseError(
            f"{name}: no 'diff --git' section found: not a git format-patch file "
            "(write patches with `make refresh`, see README 'Writing a patch')"
        )
    header, diff = text[: m.start()], text[m.start() :]
    fields = _parse_mail_header(header)
    try:
        ps = unidiff.PatchSet(diff)
    except unidiff.UnidiffParseError as e:
        raise PatchParseError(f"{name}: the diff does not parse: {e}") from None
    files = []
    for pf in ps:
        idx = re.search(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", str(pf.patch_info), re.M)
        src = None if pf.is_added_file else _strip(pf.source_file)
        tgt = None if pf.is_removed_file else _strip(pf.target_file)
        files.append(
            FilePatch(
                source=src,
                target=tgt,
                hunks=tuple(_hunk_from_unidiff(h) for h in pf),
                is_binary=pf.is_binary_file,
                old_blob=idx.group(1) if idx else None,
                new_blob=idx.group(2) if idx else None,
            )
        )
    if not files:
        raise PatchParseError(f"{name}: the diff changes no file")
    for fp in files:
        for h in fp.hunks:
            olds = sum(1 for ln in h.lines if ln.kind in " -")
            news = sum(1 for ln in h.lines if ln.kind in " +")
            if olds != h.source_length or news != h.target_length:
                raise PatchParseError(
                    f"{name}: {fp.path}: hunk {h.header} has {olds} old / {news} new lines; "
                    "the patch is truncated or was edited by hand"
                )
    return Patch(name=name, header=header, fields=fields, files=tuple(files))


def read_patch(path: Path, name: str | None = None) -> Patch:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchParseError(f"{name or path}: file not found") from None
    return parse_patch_text(data.decode("utf-8", "surrogateescape"), name or path.name)
