"""Every file a run reads or writes goes through here, so hostile paths are handled once.

Inputs: only regular files are read (a FIFO, a device or a directory is refused before it can
block or stream forever), with a size cap; YAML text is checked for nesting depth and alias
expansion before any composer recurses into it.

Outputs: :class:`OutputPlan` checks every output path before the simulation (the folder
exists and takes a new file, the path is not a directory nor one of the run's inputs), then
stages each output in a temporary file beside its target and moves all of them into place at
the end; a failure removes whatever the run wrote. Only regular files are replaced by a
rename: a symlink's target is replaced (the link stays), a character device or a FIFO is
written in place, anything else is refused. ``OSError`` becomes one :class:`BlisOutputError`
line naming the flag and the path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from blis_fast.errors import BlisOutputError

MiB = 1 << 20
MAX_CONFIG_BYTES = 64 * MiB
"""Largest YAML/JSON configuration file read (defaults, specs, bundles, model configs)."""
MAX_TRACE_BYTES = 2048 * MiB
"""Largest trace data CSV read by ``blis replay``."""
MAX_YAML_DEPTH = 100
"""Deepest YAML nesting accepted (no configuration of blis needs more than about 8)."""
MAX_YAML_NODES = 2_000_000
"""Most YAML nodes a document may expand to once aliases are followed (alias bombs)."""


def _kind(mode: int) -> str:
    """A file type in words, for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n} bytes"


def read_input_bytes(path: str | os.PathLike, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Raises ``OSError`` (so each caller's existing "cannot read <what> <path>" message applies)
    for a missing file, a FIFO, a device, a directory or a file over the limit. The file is
    opened non-blocking, so a FIFO without a writer cannot hang the open.
    """
    p = os.fspath(path)
    if "\0" in p:
        raise OSError(errno.EINVAL, "path contains a NUL byte", p.replace("\0", "\\0"))
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file", p)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"file is larger than the {_size_text(limit)} limit", p)
        chunks: list[bytes] = []
        total = 0
        while True:  # a file growing while read is still capped
            chunk = os.read(fd, min(1 << 24, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise OSError(errno.EFBIG, f"file is larger than the {_size_text(limit)} limit",
                              p)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_input_text(path: str | os.PathLike, limit: int = MAX_CONFIG_BYTES,
                    universal_newlines: bool = True) -> str:
    """:func:`read_input_bytes` decoded as UTF-8 (``UnicodeDecodeError`` on bad bytes); with
    ``universal_newlines`` CRLF and CR become LF, as Python's text mode does."""
    text = read_input_bytes(path, limit).decode("utf-8")
    if universal_newlines and "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def is_regular_file(path: str | os.PathLike) -> bool:
    """True when ``path`` names (through symlinks) a regular file."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# ------------------------------------------------------------------------------------- YAML


class YamlLimitError(yaml.MarkedYAMLError):
    """A YAML document nests too deep or expands to too many nodes through aliases."""


_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def check_yaml_limits(text: str, max_depth: int = MAX_YAML_DEPTH,
                      max_nodes: int = MAX_YAML_NODES) -> None:
    """Raise a ``yaml.YAMLError`` if ``text`` is malformed, nests deeper than ``max_depth``
    or expands past ``max_nodes`` nodes; run before composing, whose recursion (C stack in
    libyaml, Python stack in PyYAML) a deep document would overflow.

    Walks the event stream (the parser keeps its own stack, it does not recurse), counting the
    nodes under each anchor so an alias adds the size of what it repeats.
    """
    loader_class = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    loader = loader_class(text)  # the pure-Python reader raises ReaderError on control bytes
    try:
        counts: list[int] = [0]  # node count of every open collection, then the document
        anchors_open: list[str | None] = [None]
        sizes: dict[str, int] = {}
        total = 0
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, _OPEN):
                if len(counts) > max_depth:
                    raise YamlLimitError(None, None, f"nesting is deeper than {max_depth} levels",
                                         ev.start_mark)
                counts.append(1)
                anchors_open.append(ev.anchor)
            elif isinstance(ev, _CLOSE):
                size = counts.pop()
                anchor = anchors_open.pop()
                if anchor is not None:
                    sizes[anchor] = size
                counts[-1] += size
            elif isinstance(ev, yaml.ScalarEvent):
                counts[-1] += 1
                total += 1
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
            elif isinstance(ev, yaml.AliasEvent):
                added = sizes.get(ev.anchor, 1)
                counts[-1] += added
                total += added
            elif isinstance(ev, yaml.DocumentEndEvent):
                counts = [0]
                anchors_open = [None]
                total = 0
            if total > max_nodes or counts[-1] > max_nodes:
                raise YamlLimitError(None, None, f"the document expands to more than {max_nodes}"
                                     " nodes through aliases", ev.start_mark)
    except yaml.MarkedYAMLError as exc:
        # libyaml >= 0.2.5 scans ahead and stops a deep document with its own nesting limit
        # before the events reach the check above: the same refusal, in the same words
        if "maximum nesting depth" not in str(exc.problem or ""):
            raise
        raise YamlLimitError(None, None, f"nesting is deeper than {max_depth} levels",
                             exc.problem_mark) from None
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------------ outputs


def _reason(exc: OSError) -> str:
    """An OSError as a short lower-case reason ("no space left on device")."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _is_special_location(real: str) -> bool:
    """Paths under /proc and /dev (``/dev/stdout``, ``/proc/self/fd/1``) are written in place:
    renaming over them would replace a device node or detach the stream a shell redirected."""
    return real.startswith(("/proc/", "/dev/"))


@dataclass
class _Staged:
    flag: str
    path: str
    dest: str  # where the bytes go (a symlink resolved)
    tmp: str | None  # the staged temporary file (None: written in place at commit)
    data: bytes | None = None  # in-place content
    existed: bool = False


@dataclass
class OutputPlan:
    """The output paths of one command: checked up front, written all or nothing.

    ``check_file``/``check_dir`` run before any simulation; ``stage_*`` writes a temporary
    file beside each target; ``commit`` moves them into place. Used as a context manager, an
    exception before ``commit`` completes removes every temporary file, every file the plan
    created and every directory it made.
    """

    inputs: dict[str, str] = field(default_factory=dict)  # real path -> flag naming it
    _checked: dict[str, str] = field(default_factory=dict)  # real path -> flag
    _dirs: dict[str, str] = field(default_factory=dict)  # real path of an output folder -> flag
    _staged: list[_Staged] = field(default_factory=list)
    _made_dirs: list[str] = field(default_factory=list)
    _created: list[str] = field(default_factory=list)

    def add_inputs(self, named: Iterable[tuple[str, str]]) -> None:
        """Register the run's input files ``(flag, path)``; an output may not name one."""
        for flag, path in named:
            if path:
                with contextlib.suppress(OSError, ValueError):
                    self.inputs[os.path.realpath(path)] = flag

    def _fail(self, flag: str, path: str, reason: str) -> BlisOutputError:
        return BlisOutputError(f"{flag} {path}: {reason}")

    def check_file(self, path: str | os.PathLike, flag: str) -> None:
        """Refuse now what writing ``path`` at the end would fail on or would destroy."""
        p = os.fspath(path)
        if not p:
            raise self._fail(flag, repr(p), "empty path")
        try:
            real = os.path.realpath(p)
        except (OSError, ValueError) as exc:
            raise self._fail(flag, p, str(exc)) from None
        if "\0" in p:
            raise self._fail(flag, repr(p), "path contains a NUL byte")
        if real in self.inputs:
            raise self._fail(flag, p, f"is also an input of this run ({self.inputs[real]}); "
                                      "writing it would overwrite that input")
        if real in self._checked and self._checked[real] != flag:
            raise self._fail(flag, p, f"is also written by {self._checked[real]}")
        self._check_not_a_folder(real, flag, p)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise self._fail(flag, p, _reason(exc)) from None
        if st is not None and not stat.S_ISREG(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                raise self._fail(flag, p, "is a directory; expected a file path")
            if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
                raise self._fail(flag, p, f"is {_kind(st.st_mode)}; cannot write it")
        elif st is None or not _is_special_location(real):
            self._probe_dir(os.path.dirname(real) or ".", flag, p)
        self._checked[real] = flag

    def _check_not_a_folder(self, real: str, flag: str, shown: str) -> None:
        """Refuse a file output that is an output folder, or a folder above one (writing the
        file would need a directory there, or the folder would replace the file)."""
        for folder, dflag in self._dirs.items():
            if real == folder:
                raise self._fail(flag, shown, f"is also the output folder of {dflag}")
            if folder.startswith(real + os.sep):
                raise self._fail(flag, shown, f"is a folder above {folder}, the output folder "
                                              f"of {dflag}")

    def check_dir(self, path: str | os.PathLike, flag: str, files: Iterable[str] = ()) -> None:
        """An output folder: an existing writable directory, or one that can be created, that
        no file output names (nor a folder above it). ``files`` are the names the command
        writes in it: each becomes one of the plan's outputs, so another output naming one is
        refused now, whether the folder exists yet or not."""
        p = os.fspath(path)
        if not p:
            raise self._fail(flag, repr(p), "empty path")
        if "\0" in p:
            raise self._fail(flag, repr(p), "path contains a NUL byte")
        real = os.path.realpath(p)
        if real in self.inputs:
            raise self._fail(flag, p, f"is also an input of this run ({self.inputs[real]})")
        for other, oflag in self._checked.items():
            if real == other:
                raise self._fail(flag, p, f"is also written as a file by {oflag}")
            if real.startswith(other + os.sep):
                raise self._fail(flag, p, f"is inside {other}, which {oflag} writes as a file")
        probe = real
        while not os.path.lexists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if not os.path.isdir(probe):
            what = "is not a directory" if probe == real else f"{probe} is not a directory"
            raise self._fail(flag, p, what)
        self._probe_dir(probe, flag, p)
        self._dirs[real] = flag
        for name in files:
            inner = os.path.join(real, name)
            if inner in self.inputs:
                raise self._fail(flag, os.path.join(p, name), "is also an input of this run "
                                 f"({self.inputs[inner]}); writing it would overwrite that input")
            if self._checked.get(inner, flag) != flag:
                raise self._fail(flag, os.path.join(p, name),
                                 f"is also written by {self._checked[inner]}")
            self._checked[inner] = flag

    def _probe_dir(self, folder: str, flag: str, shown: str) -> None:
        """Create and remove an empty file in ``folder``: the test that the final write would
        pass (catches missing folders, read-only file systems, /proc and permissions)."""
        if not os.path.isdir(folder):
            raise self._fail(flag, shown, f"folder {folder} does not exist")
        try:
            fd, tmp = tempfile.mkstemp(prefix=".blis-probe.", dir=folder)
        except OSError as exc:
            raise self._fail(flag, shown, f"cannot create a file in {folder}: "
                             f"{_reason(exc)}") from None
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)

    def make_dir(self, path: str | os.PathLike, flag: str) -> Path:
        """Create an output folder (and missing parents), remembered for the rollback."""
        target = Path(path)
        missing = []
        probe = target
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise self._fail(flag, str(path), f"cannot create folder {d}: "
                                 f"{_reason(exc)}") from None
            self._made_dirs.append(str(d))
        if not target.is_dir():
            raise self._fail(flag, str(path), "is not a directory")
        return target

    def stage(self, path: str | os.PathLike, flag: str,
              write: Callable[[str], None] | bytes) -> None:
        """Stage one output: ``write(tmp_path)`` fills a temporary file beside the target (or
        ``write`` is the bytes); a device or FIFO target keeps its bytes for ``commit``."""
        p = os.fspath(path)
        try:
            real = os.path.realpath(p)
            st = os.stat(p) if os.path.exists(p) else None
        except (OSError, ValueError) as exc:
            raise self._fail(flag, p, str(exc)) from None
        special = st is not None and not stat.S_ISREG(st.st_mode)
        if special or (st is not None and _is_special_location(real)):
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise self._fail(flag, p, "is a directory; expected a file path")
            data = write if isinstance(write, bytes) else self._render(write, flag, p)
            self._staged.append(_Staged(flag, p, p, None, data, True))
            return
        folder = os.path.dirname(real) or "."
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp",
                                       dir=folder)
        except OSError as exc:
            raise self._fail(flag, p, f"cannot write: {_reason(exc)}") from None
        self._staged.append(_Staged(flag, p, real, tmp, None, st is not None))
        try:
            if isinstance(write, bytes):
                with os.fdopen(fd, "wb") as fh:
                    fh.write(write)
            else:
                os.close(fd)
                write(tmp)
            os.chmod(tmp, 0o644)
        except OSError as exc:
            raise self._fail(flag, p, f"cannot write: {_reason(exc)}") from None

    def _render(self, write: Callable[[str], None], flag: str, p: str) -> bytes:
        """Run a file writer into a private temporary file and return its bytes."""
        fd, tmp = tempfile.mkstemp(prefix=".blis-render.", suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            return Path(tmp).read_bytes()
        except OSError as exc:
            raise self._fail(flag, p, f"cannot write: {_reason(exc)}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def stage_text(self, path: str | os.PathLike, flag: str, text: str) -> None:
        """Stage UTF-8 text."""
        self.stage(path, flag, text.encode("utf-8", errors="surrogatepass"))

    def commit(self) -> None:
        """Move every staged file into place (in-place targets are written last)."""
        for item in sorted(self._staged, key=lambda s: s.tmp is None):
            try:
                if item.tmp is not None:
                    os.replace(item.tmp, item.dest)
                    item.tmp = None
                    if not item.existed:
                        self._created.append(item.dest)
                else:
                    _write_in_place(item.dest, item.data or b"")
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    raise self._fail(item.flag, item.path, "is a FIFO that no process reads"
                                     ) from None
                raise self._fail(item.flag, item.path, f"cannot write: {_reason(exc)}") from None
        self._staged.clear()
        self._made_dirs.clear()
        self._created.clear()

    def rollback(self) -> None:
        """Remove the temporary files, the files created and the folders made by this plan."""
        for item in self._staged:
            if item.tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(item.tmp)
        for path in self._created:
            with contextlib.suppress(OSError):
                os.unlink(path)
        for d in reversed(self._made_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        self._staged.clear()
        self._created.clear()
        self._made_dirs.clear()

    def __enter__(self) -> OutputPlan:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.rollback()


def _write_in_place(path: str, data: bytes) -> None:
    """Write to a device, a FIFO or a /proc//dev path without replacing it. A FIFO nobody
    reads is refused (ENXIO) instead of blocking."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_output_file(path: str | os.PathLike, flag: str,
                      write: Callable[[str], None] | bytes | str) -> None:
    """Write one output file atomically (see :class:`OutputPlan`): ``write`` is the text, the
    bytes or a function filling a temporary path."""
    if isinstance(write, str):
        write = write.encode("utf-8", errors="surrogatepass")
    with OutputPlan() as plan:
        plan.stage(path, flag, write)
        plan.commit()


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_TRACE_BYTES",
    "MAX_YAML_DEPTH",
    "OutputPlan",
    "YamlLimitError",
    "check_yaml_limits",
    "is_regular_file",
    "read_input_bytes",
    "read_input_text",
    "write_output_file",
]
