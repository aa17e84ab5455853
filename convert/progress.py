"""Progress of a conversion in tensors and bytes: tqdm when installed, else one stderr line."""

from __future__ import annotations

import sys
import threading
import time


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


class Progress:
    """Counts bytes read per source tensor; a tensor is done when all its bytes were read.
    Draws nothing unless `enabled` (the CLI enables it when stderr is a terminal and not --json)."""

    def __init__(self, sizes: dict[str, int], enabled: bool, stream=None):
        self.sizes = sizes
        self.total_bytes, self.total_tensors = sum(sizes.values()), len(sizes)
        self.bytes = self.tensors = 0
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stream = stream or sys.stderr
        self._t0 = time.monotonic()
        self._last = 0.0
        self._bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=self.total_bytes, unit="B", unit_scale=True, desc="convert",
                                 file=self._stream, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def update(self, name: str, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes
            seen = self._seen.get(name, 0) + nbytes
            self._seen[name] = seen
            if seen >= self.sizes.get(name, 0) and seen - nbytes < self.sizes.get(name, 0):
                self.tensors += 1
            if not self.enabled:
                return
            if self._bar is not None:
                self._bar.update(nbytes)
                now = time.monotonic()
                if now - self._last > 0.2:
                    self._bar.set_postfix_str(f"{self.tensors}/{self.total_tensors} tensors",
                                              refresh=False)
                    self._last = now
                return
            now = time.monotonic()
            if now - self._last > 0.2 or self.bytes >= self.total_bytes:
                self._last = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.bytes / max(now - self._t0, 1e-9)
        self._stream.write(f"\rconverting: {self.tensors}/{self.total_tensors} tensors, "
                           f"{_fmt_bytes(self.bytes)} / {_fmt_bytes(self.total_bytes)} "
                           f"({_fmt_bytes(rate)}/s)   ")
        self._stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.tensors}/{self.total_tensors} tensors")
            self._bar.close()
        else:
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()
