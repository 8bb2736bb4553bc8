"""One encoder and the decoders, built once for the whole process."""

from __future__ import annotations

import msgspec

encoder = msgspec.json.Encoder()
encode = encoder.encode
