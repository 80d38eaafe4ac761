"""TensorBoard scalars without TensorFlow: a small event-file writer for the neutral core.

An event file is a TFRecord file of serialized `tensorflow.Event` protos. A TFRecord is
  uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
(little endian). Only the proto fields scalars need are encoded, by hand:
  Event:   wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
           summary = 5 (Summary)
  Summary: value = 1 (repeated Value);  Value: tag = 1 (string), simple_value = 2 (float)
The tests read the files back with TensorFlow's own TFRecord reader (which verifies the
checksums) and Event proto.
"""
import os
import socket
import struct
import time


def _crc32c_table():
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):                      # Castagnoli polynomial, reflected
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
  """TFRecord stores rotated-and-offset CRCs (so a CRC of CRCs is not trivially valid)."""
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
  out = bytearray()
  value &= (1 << 64) - 1                    # int64 two's complement, as protobuf does
  while True:
    bits, value = value & 0x7F, value >> 7
    out.append(bits | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  return _varint(number << 3 | wire_type) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
  return _field(number, 2, _varint(len(data)) + data)


def event(step: int, wall_time: float, scalars: dict | None = None,
          file_version: str | None = None) -> bytes:
  """A serialized Event with the given scalars (tag -> float)."""
  out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
  if file_version is not None:
    out += _bytes_field(3, file_version.encode())
  if scalars:
    values = b"".join(
        _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
        for tag, value in scalars.items())
    out += _bytes_field(5, values)
  return out


def record(data: bytes) -> bytes:
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked(crc32c(length))) + data
          + struct.pack("<I", _masked(crc32c(data))))


class ScalarWriter:
  """Appends scalars to DIR/events.out.tfevents.<time>.<host>.<pid>.<n>, flushed per call, so
  `tensorboard --logdir DIR` shows a run while it trains."""
  _count = 0

  def __init__(self, log_dir: str):
    os.makedirs(log_dir, exist_ok=True)
    ScalarWriter._count += 1
    name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
            f"{os.getpid()}.{ScalarWriter._count}")
    self.path = os.path.join(log_dir, name)
    self._file = open(self.path, "ab")
    self._write(event(0, time.time(), file_version="brain.Event:2"))

  def _write(self, data: bytes):
    self._file.write(record(data))
    self._file.flush()

  def scalars(self, step: int, values: dict):
    finite = {k: float(v) for k, v in values.items() if v is not None}
    if finite:
      self._write(event(step, time.time(), finite))

  def close(self):
    self._file.close()
