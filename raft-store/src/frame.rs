//! The bytes of the log's segment files: frames of records, each frame checksummed whole.
//!
//! A frame is what one write and one `fdatasync` put on disk: a group of appended entries, a
//! vote, a truncation, a purge. The writer syncs every frame before it writes the next (the
//! committed-id hint waits in memory for the next frame), so a crash can leave at most the
//! *last* frame of the *last* segment incomplete, its blocks persisted in any order. That frame
//! was never reported durable, and open cuts it off (the torn tail). A damaged frame followed
//! by a valid one is corruption, never a torn write: the header's magic and checksum let the
//! parser find a valid frame after damage without trusting the damaged length.
//!
//! ```text
//! frame  = magic: u32 LE | body_len: u32 LE | crc32(body): u32 LE | crc32(first 12 bytes): u32 LE | body
//! body   = record*
//! record = kind: u8 | payload_len: u32 LE | payload
//! ```
//!
//! Pure: no I/O here, so the parser is tested on every kind of damage directly.

/// Bytes before a frame's body: magic, length, body checksum, header checksum.
pub(crate) const FRAME_HEADER_BYTES: usize = 16;

/// The first bytes of every frame ("TLYF").
const FRAME_MAGIC: u32 = 0x4659_4c54;
/// Bytes before a record's payload: its kind and length.
pub(crate) const RECORD_HEADER_BYTES: usize = 5;
/// Bytes of an entry record's payload before the encoded entry: its index.
pub(crate) const ENTRY_INDEX_BYTES: usize = 8;

/// Largest frame body the parser accepts. A length field above it is damage, not a frame: no
/// writer produces one (entries are capped by `StoreConfig::max_entry_bytes` and a group by
/// `MAX_ENTRIES_PER_COMMIT`), and trusting it would make open allocate whatever a flipped bit
/// says.
pub(crate) const MAX_FRAME_BODY_BYTES: usize = 1 << 31;

/// Identifies the first record of every segment.
pub(crate) const MAGIC: &[u8; 14] = b"tally-raft-wal";

const KIND_HEADER: u8 = 1;
const KIND_ENTRY: u8 = 2;
const KIND_VOTE: u8 = 3;
const KIND_COMMITTED: u8 = 4;
const KIND_PURGED: u8 = 5;
const KIND_TRUNCATE: u8 = 6;

/// One record, borrowing its payload from the frame it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// First record of a segment: the format version and the segment's sequence number.
    Header { version: u32, sequence: u64 },
    /// A log entry: its index and its rmp-serde bytes, which start at `bytes_offset` within
    /// the frame's body.
    Entry {
        index: u64,
        bytes: &'a [u8],
        bytes_offset: usize,
    },
    /// The vote (rmp-serde bytes); the last one read wins.
    Vote(&'a [u8]),
    /// The committed-id hint (rmp-serde bytes); the last one read wins.
    Committed(&'a [u8]),
    /// Every entry `<= upto` is gone; `log_id` is the encoded purged log id.
    Purged { upto: u64, log_id: &'a [u8] },
    /// Every entry `>= from` written before this record is void.
    TruncateFrom(u64),
}

/// Builds one frame; [`FrameBuilder::finish`] fills in its length and checksum.
pub(crate) struct FrameBuilder {
    buf: Vec<u8>,
}

impl FrameBuilder {
    pub(crate) fn new() -> Self {
        Self::with_capacity(64)
    }

    pub(crate) fn with_capacity(body_bytes: usize) -> Self {
        let mut buf = Vec::with_capacity(FRAME_HEADER_BYTES + body_bytes);
        buf.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
        Self { buf }
    }

    fn record(&mut self, kind: u8, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len).expect("a record payload fits u32: entries are capped");
        self.buf.push(kind);
        self.buf.extend_from_slice(&len.to_le_bytes());
        for part in parts {
            self.buf.extend_from_slice(part);
        }
    }

    pub(crate) fn header(&mut self, version: u32, sequence: u64) -> &mut Self {
        self.record(
            KIND_HEADER,
            &[MAGIC, &version.to_le_bytes(), &sequence.to_le_bytes()],
        );
        self
    }

    /// Adds an entry; returns where its bytes start within the finished frame (from the
    /// frame's first byte), so the caller can index it without parsing.
    pub(crate) fn entry(&mut self, index: u64, bytes: &[u8]) -> usize {
        self.record(KIND_ENTRY, &[&index.to_le_bytes(), bytes]);
        self.buf.len() - bytes.len()
    }

    pub(crate) fn vote(&mut self, bytes: &[u8]) -> &mut Self {
        self.record(KIND_VOTE, &[bytes]);
        self
    }

    pub(crate) fn committed(&mut self, bytes: &[u8]) -> &mut Self {
        self.record(KIND_COMMITTED, &[bytes]);
        self
    }

    pub(crate) fn purged(&mut self, upto: u64, log_id: &[u8]) -> &mut Self {
        self.record(KIND_PURGED, &[&upto.to_le_bytes(), log_id]);
        self
    }

    pub(crate) fn truncate_from(&mut self, from: u64) -> &mut Self {
        self.record(KIND_TRUNCATE, &[&from.to_le_bytes()]);
        self
    }

    /// The frame's bytes, ready to write.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let body_len = self.buf.len() - FRAME_HEADER_BYTES;
        assert!(
            body_len <= MAX_FRAME_BODY_BYTES,
            "a frame of {body_len} bytes is over the {MAX_FRAME_BODY_BYTES} limit"
        );
        let crc = crc32fast::hash(&self.buf[FRAME_HEADER_BYTES..]);
        self.buf[..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        self.buf[4..8].copy_from_slice(&(body_len as u32).to_le_bytes());
        self.buf[8..12].copy_from_slice(&crc.to_le_bytes());
        let header_crc = crc32fast::hash(&self.buf[..12]);
        self.buf[12..16].copy_from_slice(&header_crc.to_le_bytes());
        self.buf
    }
}

/// A frame found in a segment: its records.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    pub(crate) records: Vec<Record<'a>>,
}

/// How a segment's bytes end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// After the last valid frame there is nothing.
    Clean,
    /// The last frame is cut short or fails its checksum, and nothing valid follows: a write
    /// that a crash interrupted. The valid log ends at `valid_len`.
    Torn { valid_len: usize },
}

/// Splits `data` into frames. A damaged frame that is not the last thing in the data is
/// corruption (`Err`, naming the offset); a damaged last frame is [`Ending::Torn`].
pub(crate) fn parse(data: &[u8]) -> Result<(Vec<Frame<'_>>, Ending), String> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < data.len() {
        match frame_at(data, at) {
            Ok((frame, next)) => {
                frames.push(frame);
                at = next;
            }
            Err(FrameDamage::Torn) => return Ok((frames, Ending::Torn { valid_len: at })),
            Err(FrameDamage::Corrupt(detail)) => {
                return Err(format!("frame at byte {at}: {detail}"))
            }
        }
    }
    Ok((frames, Ending::Clean))
}

enum FrameDamage {
    /// Nothing valid follows the damage: a write a crash interrupted.
    Torn,
    /// The frame is damaged and a valid frame follows it, or its records do not parse.
    Corrupt(String),
}

/// The header at `at` if it is whole and its checksum holds: `(body_len, body_crc)`.
fn header_at(data: &[u8], at: usize) -> Option<(usize, u32)> {
    let header = data.get(at..at + FRAME_HEADER_BYTES)?;
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    (word(0) == FRAME_MAGIC && crc32fast::hash(&header[..12]) == word(12))
        .then(|| (word(4) as usize, word(8)))
}

/// Whether a whole, valid frame starts anywhere after `from`: a frame whose header and body
/// checksums both hold. Used only on damage, to tell a torn tail from corruption.
fn valid_frame_after(data: &[u8], from: usize) -> bool {
    let magic = FRAME_MAGIC.to_le_bytes();
    (from..data.len().saturating_sub(FRAME_HEADER_BYTES - 1)).any(|at| {
        data[at..at + 4] == magic
            && header_at(data, at).is_some_and(|(len, crc)| {
                len > 0
                    && data
                        .get(at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + len)
                        .is_some_and(|body| crc32fast::hash(body) == crc)
            })
    })
}

fn damage(data: &[u8], at: usize, detail: &str) -> FrameDamage {
    if valid_frame_after(data, at + 1) {
        FrameDamage::Corrupt(format!("{detail}, with a valid frame after it"))
    } else {
        FrameDamage::Torn
    }
}

fn frame_at(data: &[u8], at: usize) -> Result<(Frame<'_>, usize), FrameDamage> {
    let Some((body_len, crc)) = header_at(data, at) else {
        return Err(damage(data, at, "damaged frame header"));
    };
    if body_len == 0 || body_len > MAX_FRAME_BODY_BYTES {
        return Err(FrameDamage::Corrupt(format!(
            "a checksummed header with an impossible length {body_len}"
        )));
    }
    let end = at + FRAME_HEADER_BYTES + body_len;
    let Some(body) = data.get(at + FRAME_HEADER_BYTES..end) else {
        return Err(damage(data, at, "frame cut short"));
    };
    if crc32fast::hash(body) != crc {
        return Err(damage(data, at, "checksum mismatch"));
    }
    let records = records(body, at + FRAME_HEADER_BYTES).map_err(FrameDamage::Corrupt)?;
    Ok((Frame { records }, end))
}

/// The records of one frame body, which starts at `body_offset` in the segment.
fn records(body: &[u8], body_offset: usize) -> Result<Vec<Record<'_>>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        if body.len() - at < RECORD_HEADER_BYTES {
            return Err(format!("record header cut short at body byte {at}"));
        }
        let kind = body[at];
        let len = u32::from_le_bytes(body[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        let start = at + RECORD_HEADER_BYTES;
        let Some(payload) = body.get(start..start + len) else {
            return Err(format!("record at body byte {at} runs past its frame"));
        };
        out.push(record(kind, payload, body_offset + start)?);
        at = start + len;
    }
    Ok(out)
}

fn record(kind: u8, payload: &[u8], payload_offset: usize) -> Result<Record<'_>, String> {
    let u64_at = |at: usize| -> Result<u64, String> {
        payload
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("record of kind {kind} is too short"))
    };
    Ok(match kind {
        KIND_HEADER => {
            let magic_len = MAGIC.len();
            if payload.len() != magic_len + 12 || &payload[..magic_len] != MAGIC {
                return Err("segment header without the Tally magic".to_owned());
            }
            let version = u32::from_le_bytes(
                payload[magic_len..magic_len + 4]
                    .try_into()
                    .expect("4 bytes"),
            );
            Record::Header {
                version,
                sequence: u64_at(magic_len + 4)?,
            }
        }
        KIND_ENTRY => Record::Entry {
            index: u64_at(0)?,
            bytes: &payload[ENTRY_INDEX_BYTES..],
            bytes_offset: payload_offset + ENTRY_INDEX_BYTES,
        },
        KIND_VOTE => Record::Vote(payload),
        KIND_COMMITTED => Record::Committed(payload),
        KIND_PURGED => Record::Purged {
            upto: u64_at(0)?,
            log_id: &payload[8..],
        },
        KIND_TRUNCATE => Record::TruncateFrom(u64_at(0)?),
        other => return Err(format!("unknown record kind {other}")),
    })
}

/// A segment's header (format version, sequence number): the first record of its first
/// frame; otherwise what is there instead.
pub(crate) fn segment_header(frames: &[Frame<'_>]) -> Result<(u32, u64), &'static str> {
    match frames.first().and_then(|f| f.records.first()) {
        Some(Record::Header { version, sequence }) => Ok((*version, *sequence)),
        Some(_) => Err("first record is not a segment header"),
        None => Err("no segment header"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three frames, and where each starts.
    fn segment_with_offsets() -> (Vec<u8>, [usize; 3]) {
        let mut out = Vec::new();
        let mut header = FrameBuilder::new();
        header.header(7, 3).vote(b"v1");
        out.extend(header.finish());
        let second = out.len();
        let mut group = FrameBuilder::new();
        group.entry(10, b"ten");
        group.entry(11, b"eleven");
        out.extend(group.finish());
        let third = out.len();
        let mut other = FrameBuilder::new();
        other.truncate_from(11).purged(9, b"p").committed(b"c");
        out.extend(other.finish());
        (out, [0, second, third])
    }

    fn segment() -> Vec<u8> {
        segment_with_offsets().0
    }

    #[test]
    fn frames_round_trip_with_entry_offsets() {
        let data = segment();
        let (frames, ending) = parse(&data).expect("parse");
        assert_eq!(ending, Ending::Clean);
        assert_eq!(frames.len(), 3);
        assert_eq!(segment_header(&frames), Ok((7, 3)));
        assert_eq!(frames[0].records[1], Record::Vote(b"v1"));
        for record in &frames[1].records {
            let Record::Entry {
                bytes,
                bytes_offset,
                ..
            } = record
            else {
                panic!("entries expected: {record:?}")
            };
            assert_eq!(&data[*bytes_offset..*bytes_offset + bytes.len()], *bytes);
        }
        assert_eq!(
            frames[2].records,
            vec![
                Record::TruncateFrom(11),
                Record::Purged {
                    upto: 9,
                    log_id: b"p"
                },
                Record::Committed(b"c")
            ]
        );
    }

    #[test]
    fn the_offset_the_builder_gives_is_where_the_bytes_are() {
        let mut group = FrameBuilder::new();
        let at = group.entry(5, b"payload");
        let frame = group.finish();
        assert_eq!(&frame[at..at + 7], b"payload");
    }

    #[test]
    fn a_last_frame_cut_anywhere_is_a_torn_tail_at_the_last_whole_frame() {
        let (data, [_, _, last]) = segment_with_offsets();
        for cut in last + 1..data.len() {
            let (frames, ending) = parse(&data[..cut]).expect("a cut tail is not corruption");
            assert_eq!(frames.len(), 2, "cut at {cut}");
            assert_eq!(ending, Ending::Torn { valid_len: last }, "cut at {cut}");
        }
    }

    #[test]
    fn a_damaged_last_frame_is_torn_and_zeroes_after_the_log_end_it() {
        let mut data = segment();
        let end = data.len();
        data[end - 1] ^= 0xff;
        let (frames, ending) = parse(&data).expect("torn");
        assert_eq!(frames.len(), 2);
        assert!(matches!(ending, Ending::Torn { .. }));

        let mut zeroed = segment();
        let clean_len = zeroed.len();
        zeroed.extend([0u8; 4096]);
        let (frames, ending) = parse(&zeroed).expect("zero tail");
        assert_eq!(frames.len(), 3);
        assert_eq!(
            ending,
            Ending::Torn {
                valid_len: clean_len
            }
        );
    }

    #[test]
    fn a_damaged_frame_with_a_valid_one_after_it_is_corruption() {
        let (mut data, [_, second, _]) = segment_with_offsets();
        data[second + FRAME_HEADER_BYTES + 2] ^= 0x01;
        let error = parse(&data).expect_err("damage in the middle must not be dropped");
        assert!(error.contains("checksum"), "{error}");
        let (mut data, [_, second, _]) = segment_with_offsets();
        data[second + 5] ^= 0x40;
        let error = parse(&data).expect_err("a damaged length mid-file must not be trusted");
        assert!(error.contains("header"), "{error}");
    }

    /// Any damage confined to the last frame leaves the frames before it; damage anywhere
    /// never panics and never yields a frame that was not written.
    #[test]
    fn random_damage_never_panics_and_never_invents_a_frame() {
        let (data, [_, _, last]) = segment_with_offsets();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..5_000 {
            let mut damaged = data.clone();
            let from = if round % 2 == 0 { last } else { 0 };
            for _ in 0..1 + next() % 4 {
                let at = from + (next() as usize) % (damaged.len() - from);
                damaged[at] ^= 1 << (next() % 8);
            }
            if next() % 3 == 0 {
                let cut = from + (next() as usize) % (damaged.len() - from);
                damaged.truncate(cut);
            }
            match parse(&damaged) {
                Ok((frames, _)) => {
                    assert!(frames.len() <= 3, "round {round}: {} frames", frames.len());
                    if from == last {
                        assert!(frames.len() >= 2, "round {round}: an intact frame was lost");
                    }
                }
                Err(detail) => assert!(
                    from == 0,
                    "round {round}: damage to the last frame is a torn tail, got {detail}"
                ),
            }
        }
    }

    #[test]
    fn unknown_kinds_and_foreign_headers_are_refused() {
        let mut unknown = FrameBuilder::new();
        unknown.record(99, &[]);
        let data = unknown.finish();
        let error = parse(&data).expect_err("unknown kind");
        assert!(error.contains("unknown record kind 99"), "{error}");

        let mut vote_first = FrameBuilder::new();
        vote_first.vote(b"v");
        let data = vote_first.finish();
        let (frames, _) = parse(&data).expect("parse");
        assert!(segment_header(&frames).is_err());
    }
}
