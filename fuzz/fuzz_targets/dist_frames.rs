//! Bytes from a peer (a worker or coordinator, or anyone who reaches the port): whole frames through
//! every decoder, the same bytes as a stream cut in pieces through the frame reader, and as encoded
//! activations of each wire format. Nothing may panic, hang or allocate beyond the frame limit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Read;

/// A socket that hands out `step` bytes a read.
struct Pieces<'a>(&'a [u8], usize);

impl Read for Pieces<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.len().min(self.1).min(b.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let _ = ds4_dist::protocol::decode(body);
    let _ = ds4_dist::wire::decode_data(body);
    let _ = ds4_dist::wire::decode_shared(&bytes::Bytes::copy_from_slice(body));
    let mut r = ds4_dist::wire::FrameReader::new(1 << 20, &body[..body.len().min(first as usize % 8)]);
    let mut src = Pieces(body, first as usize % 61 + 1);
    for _ in 0..100_000 {
        match r.read(&mut src) {
            Ok(ds4_dist::wire::ReadStep::Frame) => {
                let f = r.frame().to_vec();
                let _ = ds4_dist::wire::decode_data(&f);
                let _ = ds4_dist::protocol::decode(&f);
            }
            Ok(ds4_dist::wire::ReadStep::Partial) => {}
            _ => break,
        }
    }
    let mut out = Vec::new();
    for bits in [32u8, 16, 8] {
        let n = body.len() / (first as usize % 4 + 1);
        let _ = ds4_dist::codec::decode(body, n, first as usize % 70 + 1, bits, &mut out);
    }
});
