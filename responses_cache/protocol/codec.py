"""One encoder and the decoders, built once for the whole process."""

from __future__ import annotations

import msgspec

from .items import enc_hook

encoder = msgspec.json.Encoder(enc_hook=enc_hook)
encode = encoder.encode
