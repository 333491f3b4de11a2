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
UPSTREAM_STATUS_RE = re.compile(r"^(not upstream|submitted \S+|upstream since v\S+|obsolete since v\S+( \(.+\))?)$")
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
class Supersession:
    since: str  # the upstream release, "v0.5.11"
    what: str  # what upstream has, "--speculative-adaptive (load-based speculation)"


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

    @property
    def requires(self) -> list[str]:
        """Earlier patches of the series this one builds on (``Requires:``, file names)."""
        return [v for v in re.split(r"[,\s]+", self.fields.get("Requires", "")) if v]

    @property
    def superseded_by(self) -> Supersession | None:
        """``Superseded-By: vX <what upstream now has>``: the release from which upstream serves the
        patch's purpose its own way (the patch may still apply; a reviewer decides)."""
        value = " ".join(self.fields.get("Superseded-By", "").split())
        m = re.match(r"^(v\d\S*)\s+(.+)$", value)
        return Supersession(m.group(1), m.group(2)) if m else None

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
        if self.fields.get("Superseded-By", "").strip() and self.superseded_by is None:
            probs.append(
                f"{self.name}: Superseded-By must read 'vX <what upstream has>', got {self.fields['Superseded-By']!r}"
            )
        for t in self.tests:
            if "::" not in t and not t.endswith(".py"):
                probs.append(f"{self.name}: Tests entry {t!r} is not a pytest node id (path.py::name)")
        return probs


def requirement_problems(patches: list[Patch], series_names: list[str]) -> list[str]:
    """Each ``Requires:`` entry must name a patch listed earlier in the series."""
    probs = []
    for p in patches:
        earlier = series_names[: series_names.index(p.name)] if p.name in series_names else []
        for need in p.requires:
            if need not in earlier:
                where = "later in series" if need in series_names else "not in series"
                probs.append(
                    f"{p.name}: Requires {need}, which is {where}; a patch can only build on "
                    "earlier ones (reorder series or fix the header)"
                )
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


_HUNK_HEADER_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def locate_short_hunk(diff: str, first_lineno: int) -> str | None:
    """Where a diff that unidiff refused runs short: the file, the hunk header, the lines.

    ``first_lineno`` is the patch-file line the diff starts on, so the numbers point into the file."""
    path, hunk, hunk_line, old_left, new_left = "?", "", 0, 0, 0
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()

    def short(at: int) -> str:
        return (
            f"{path}: hunk {hunk} (line {hunk_line}) ends at line {at} with {old_left} old / {new_left} new "
            "line(s) still to come: the patch is truncated or was edited by hand"
        )

    for i, ln in enumerate(lines):
        lineno = first_lineno + i
        if old_left > 0 or new_left > 0:
            kind = ln[:1]
            if kind in (" ", "") and not ln.startswith(("diff --git", "@@")):
                old_left, new_left = old_left - 1, new_left - 1
                continue
            if kind == "-":
                old_left -= 1
                continue
            if kind == "+":
                new_left -= 1
                continue
            if kind == "\\":
                continue
            return short(lineno - 1)
        if ln.startswith("diff --git "):
            path = ln.split(" b/", 1)[-1]
        m = _HUNK_HEADER_RE.match(ln)
        if m:
            hunk, hunk_line = ln, lineno
            old_left = int(m.group(1) if m.group(1) is not None else 1)
            new_left = int(m.group(2) if m.group(2) is not None else 1)
    if old_left > 0 or new_left > 0:
        return short(first_lineno + len(lines) - 1)
    return None


def parse_patch_text(text: str, name: str = "<patch>") -> Patch:
    if "\r\n" in text and all(ln.endswith("\r") for ln in text.split("\n")[:5] if ln):
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
        where = locate_short_hunk(diff, header.count("\n") + 1)
        raise PatchParseError(f"{name}: the diff does not parse: " + (where or str(e))) from None
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


_REVERSED_KIND = {"+": "-", "-": "+", " ": " "}
_HUNK_RANGES_RE = re.compile(r"^@@ -(\S+) \+(\S+) @@")


def _reversed_hunk(h: Hunk) -> Hunk:
    header = _HUNK_RANGES_RE.sub(lambda m: f"@@ -{m.group(2)} +{m.group(1)} @@", h.header)
    lines = tuple(HunkLine(_REVERSED_KIND[ln.kind], ln.text) for ln in h.lines)
    return Hunk(h.target_start, h.target_length, h.source_start, h.source_length, header, lines)


def reversed_patch(patch: Patch) -> Patch:
    """The patch that undoes this one (as ``git apply -R``): each hunk's sides swapped, and each
    file's, so a tree the patch was applied to can be checked and restored hunk by hunk."""
    files = tuple(
        FilePatch(
            source=fp.target,
            target=fp.source,
            hunks=tuple(_reversed_hunk(h) for h in fp.hunks),
            is_binary=fp.is_binary,
            old_blob=fp.new_blob,
            new_blob=fp.old_blob,
        )
        for fp in patch.files
    )
    return Patch(name=f"{patch.name} (reversed)", header=patch.header, fields=patch.fields, files=files)


def index_problems(patch: Patch) -> list[str]:
    """Files changed without full blob ids: those ids are how an edited hunk is told from the one
    refresh wrote (hunkcheck's damaged-file check), so without them a hand edit would go unnoticed."""
    return [
        f"{patch.name}: {fp.path}: no full `index <old>..<new>` line; the series' format always has one "
        "(git format-patch --full-index, as `make refresh` writes): re-export the patch from the tree with "
        "`make refresh` instead of editing it by hand"
        for fp in patch.files
        if fp.hunks and not (fp.new_blob and len(fp.new_blob) in (40, 64))
    ]
