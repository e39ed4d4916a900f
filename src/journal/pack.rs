//! Bodies of events that will wait, stored compressed in the intake log.
//!
//! Why: a destination that is down, paused or on probation keeps its
//! backlog in the log for as long as it lasts, on an `emptyDir` whose
//! size (or the pod's ephemeral-storage limit) caps what courier can
//! buffer; webhook bodies are JSON, which LZ4 shrinks two to four times.
//! Why only those: an event of a destination that is delivering goes out
//! from memory within milliseconds and its segment is recycled, so
//! compressing it would cost CPU on the writer's thread, the one every
//! 202 waits for, and save no disk that stays used. The writer decides
//! per event: its destination not delivering (`DestinationState::delivering`,
//! the backpressure signal), its ready queue nearly full, or adopted.
//!
//! The LZ4 block format (lz4_flex, no unsafe code): an event is small and
//! read alone (`fetch`), so a frame's header and checksum would be bytes
//! for nothing; the event's CRC32C in its row and the record's cover the
//! compressed bytes, checked before they are decompressed.
//!
//! Encoding, in place of a body's `[len u32][bytes]`:
//! `[len u32 | PACKED][raw len u32][LZ4 block]`, `len` counting the raw
//! length and the block. A body's length never reaches 2 GiB (the largest
//! `ingress.max_body_bytes` is 256 MiB), so the top bit was always clear.

/// The bit of a body's length word that says its bytes are packed.
pub const PACKED: u32 = 1 << 31;

/// Bodies shorter than this are stored as they are: LZ4 saves little on
/// them and the 4 bytes of raw length eat into that.
const MIN_BODY: usize = 128;

/// LZ4 cannot expand a block more than this: each byte of a match's
/// length codes at most 255 bytes. A raw length beyond it is damage, not
/// a body, and is refused before anything is allocated for it.
const MAX_RATIO: usize = 255;

/// The largest body courier accepts (`ingress.max_body_bytes`' bound), so
/// the largest raw length a packed body can honestly name.
const MAX_RAW: usize = 256 << 20;

thread_local! {
    /// LZ4's hash tables, kept by the thread that packs (the journal's
    /// writer): made anew, each was an 8 KiB zeroed allocation per event.
    /// Two, as lz4_flex upgrades a small table for an input of 64 KiB or
    /// more for good, which would make every later body pay the large one.
    static TABLES: std::cell::RefCell<[lz4_flex::block::CompressTable; 2]> =
        std::cell::RefCell::new([
            lz4_flex::block::CompressTable::small(),
            lz4_flex::block::CompressTable::large(),
        ]);
}

/// Appends `body` packed, as a body part (length word and all), when that
/// saves at least an eighth of it; otherwise appends nothing and returns
/// false, and the caller stores it as it is.
pub fn put_packed(out: &mut Vec<u8>, body: &[u8]) -> bool {
    if body.len() < MIN_BODY || body.len() > MAX_RAW {
        return false;
    }
    let start = out.len();
    let worth = body.len() - body.len() / 8;
    out.resize(
        start + 8 + lz4_flex::block::get_maximum_output_size(body.len()),
        0,
    );
    let compressed = TABLES.with_borrow_mut(|[small, large]| {
        let table = if body.len() < usize::from(u16::MAX) {
            small
        } else {
            large
        };
        lz4_flex::block::compress_into_with_table(body, &mut out[start + 8..], table)
    });
    let packed = match compressed {
        Ok(n) if 4 + n < worth => n,
        _ => {
            out.truncate(start);
            return false;
        }
    };
    // Both fit in 31 bits: `4 + packed` is below the body's length.
    let len = (4 + packed) as u32 | PACKED;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&(body.len() as u32).to_le_bytes());
    out.truncate(start + 8 + packed);
    true
}

/// The raw length a packed body part (`[raw len u32][block]`) names, if
/// it could be one: `None` for damage.
pub fn raw_len(part: &[u8]) -> Option<usize> {
    let raw = u32::from_le_bytes(part.get(..4)?.try_into().ok()?) as usize;
    let block = part.len() - 4;
    (raw <= MAX_RAW && raw <= block.saturating_mul(MAX_RATIO)).then_some(raw)
}

/// The body a packed part holds, exactly its raw length long; `None` for
/// damage (a block that does not decompress to that length).
pub fn unpack(part: &[u8]) -> Option<Vec<u8>> {
    let raw = raw_len(part)?;
    let mut body = vec![0; raw];
    match lz4_flex::block::decompress_into(&part[4..], &mut body) {
        Ok(n) if n == raw => Some(body),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A webhook-like JSON body of about `len` bytes.
    fn json(len: usize) -> Vec<u8> {
        let mut b = br#"{"type":"order.paid","data":{"items":["#.to_vec();
        let mut i = 0u64;
        while b.len() < len {
            b.extend_from_slice(format!(r#"{{"sku":"A-{i:05}","qty":{}}},"#, i % 7).as_bytes());
            i += 1;
        }
        b.extend_from_slice(b"]}}");
        b
    }

    fn part(out: &[u8]) -> (u32, &[u8]) {
        let word = u32::from_le_bytes(out[..4].try_into().unwrap());
        (word, &out[4..])
    }

    #[test]
    fn a_compressible_body_comes_back_whole_from_fewer_bytes() {
        // The large one first: a small body after it packs as well.
        for len in [100_000, MIN_BODY, 1024] {
            let body = json(len);
            let mut out = b"before".to_vec();
            assert!(put_packed(&mut out, &body), "{len}");
            let (word, rest) = part(&out[6..]);
            assert_ne!(word & PACKED, 0);
            assert_eq!((word & !PACKED) as usize, rest.len());
            assert!(
                rest.len() < body.len() * 7 / 8,
                "{} of {}",
                rest.len(),
                body.len()
            );
            assert_eq!(raw_len(rest), Some(body.len()));
            assert_eq!(unpack(rest).as_deref(), Some(&body[..]));
            assert_eq!(&out[..6], b"before");
        }
    }

    #[test]
    fn a_body_it_would_not_shrink_is_left_to_the_caller() {
        let mut noise = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.push(x as u8);
        }
        // Random hex, as a test that fills a disk sends (suite/disk.rs).
        let hex: Vec<u8> = noise
            .iter()
            .map(|b| b"0123456789abcdef"[(b & 15) as usize])
            .collect();
        let short = &json(MIN_BODY)[..MIN_BODY - 1];
        for body in [&noise[..], &hex[..], short, b""] {
            let mut out = b"kept".to_vec();
            assert!(!put_packed(&mut out, body));
            assert_eq!(out, b"kept");
        }
    }

    #[test]
    fn damage_is_refused_not_allocated_or_misread() {
        let body = json(4096);
        let mut out = Vec::new();
        assert!(put_packed(&mut out, &body));
        let good = out[4..].to_vec();
        // A raw length past what the block could hold.
        let mut huge = good.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(raw_len(&huge), None);
        assert_eq!(unpack(&huge), None);
        // Past what LZ4 can expand the block to, though under `MAX_RAW`.
        let block = good.len() - 4;
        let mut past = good.clone();
        past[..4].copy_from_slice(&((block * MAX_RATIO + 1) as u32).to_le_bytes());
        assert_eq!(raw_len(&past), None);
        let mut at = good.clone();
        at[..4].copy_from_slice(&((block * MAX_RATIO) as u32).to_le_bytes());
        assert_eq!(raw_len(&at), Some(block * MAX_RATIO));
        // One byte more or less than the block decodes to.
        for raw in [body.len() - 1, body.len() + 1] {
            let mut wrong = good.clone();
            wrong[..4].copy_from_slice(&(raw as u32).to_le_bytes());
            assert_eq!(unpack(&wrong), None, "{raw}");
        }
        // A block cut short, and one of garbage.
        assert_eq!(unpack(&good[..good.len() - 3]), None);
        let mut garbage = good.clone();
        for b in &mut garbage[4..] {
            *b = 0xff;
        }
        assert_eq!(unpack(&garbage), None);
        assert_eq!(unpack(&good[..3]), None);
    }
}
