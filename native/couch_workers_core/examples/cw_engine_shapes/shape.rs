//! J2's per-job storage shape: the store calls of one accept round that
//! takes one job and of that job's finish, as recorded from a real run
//! (`record.rs`), and the keys a pending job has before it is accepted.
//!
//! The recorded calls name one job (its id, the versionstamp of its add,
//! the versionstamp of its accept). To replay the shape for job `n`, each
//! of those byte strings is replaced by one of the same length made from
//! `n` ([`Shape::instantiate`]): keys and values keep their sizes and
//! their order (a later job's pending key sorts after an earlier one's).

/// One store call, as `Transaction` has them.
#[derive(Clone, Debug)]
pub enum Op {
    Get(Vec<u8>),
    Range {
        begin: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
        reverse: bool,
    },
    Set(Vec<u8>, Vec<u8>),
    Clear(Vec<u8>),
    ClearRange(Vec<u8>, Vec<u8>),
    Add(Vec<u8>, i64),
    ByteMax(Vec<u8>, Vec<u8>),
    /// Key with a 10-byte placeholder and its 4-byte little-endian offset.
    StampKey(Vec<u8>, Vec<u8>),
    /// Value with a placeholder and its offset.
    StampValue(Vec<u8>, Vec<u8>),
    /// Watches and read conflict keys: counted, not replayed (no engine
    /// here has them; the embedded store's watches are in-process maps).
    Other,
}

/// One recorded transaction.
#[derive(Clone, Debug, Default)]
pub struct TxShape {
    pub writes: bool,
    pub ops: Vec<Op>,
}

impl TxShape {
    pub fn writes_anything(&self) -> bool {
        self.ops.iter().any(|op| !matches!(op, Op::Get(_) | Op::Range { .. } | Op::Other))
    }
}

/// Everything a replay needs.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    /// The byte strings that name the recorded job: its id, then
    /// versionstamps; each replaced per job.
    pub marks: Vec<Vec<u8>>,
    /// The recorded job's keys before its accept (they hold a mark).
    pub per_job: Vec<(Vec<u8>, Vec<u8>)>,
    /// The other keys of the store then (the type's counters, the worker's
    /// records), written once.
    pub shared: Vec<(Vec<u8>, Vec<u8>)>,
    /// The accept round's transactions, then the finish's, in order.
    pub txs: Vec<TxShape>,
}

/// The id every recorded job has: fixed width, so that job `n`'s id has
/// the same length.
pub fn job_id(n: u64) -> Vec<u8> {
    format!("job-{n:08}").into_bytes()
}

fn mark_value(mark: usize, len: usize, n: u64) -> Vec<u8> {
    if mark == 0 {
        return job_id(n);
    }
    // A versionstamp: an 8-byte big-endian "version" that rises with n
    // (one range per mark), then the 2-byte order.
    let mut v = ((mark as u64) << 40 | n).to_be_bytes().to_vec();
    v.resize(len, 0);
    v
}

fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || bytes.len() < from.len() {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

impl Shape {
    fn subst(&self, bytes: &[u8], n: u64) -> Vec<u8> {
        let mut out = bytes.to_vec();
        for (i, mark) in self.marks.iter().enumerate() {
            out = replace_all(&out, mark, &mark_value(i, mark.len(), n));
        }
        out
    }

    /// Whether `bytes` holds one of the marks.
    pub fn marked(&self, bytes: &[u8]) -> bool {
        self.marks.iter().any(|m| !m.is_empty() && bytes.windows(m.len()).any(|w| w == m.as_slice()))
    }

    /// Job `n`'s pending keys and values.
    pub fn fill_for(&self, n: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.per_job.iter().map(|(k, v)| (self.subst(k, n), self.subst(v, n))).collect()
    }

    /// The recorded transactions, for job `n`.
    pub fn instantiate(&self, n: u64) -> Vec<TxShape> {
        let s = |b: &Vec<u8>| self.subst(b, n);
        self.txs
            .iter()
            .map(|tx| TxShape {
                writes: tx.writes,
                ops: tx
                    .ops
                    .iter()
                    .map(|op| match op {
                        Op::Get(k) => Op::Get(s(k)),
                        Op::Range { begin, end, limit, reverse } => {
                            Op::Range { begin: s(begin), end: s(end), limit: *limit, reverse: *reverse }
                        }
                        Op::Set(k, v) => Op::Set(s(k), s(v)),
                        Op::Clear(k) => Op::Clear(s(k)),
                        Op::ClearRange(b, e) => Op::ClearRange(s(b), s(e)),
                        Op::Add(k, d) => Op::Add(s(k), *d),
                        Op::ByteMax(k, v) => Op::ByteMax(s(k), s(v)),
                        Op::StampKey(k, v) => Op::StampKey(s(k), s(v)),
                        Op::StampValue(k, v) => Op::StampValue(s(k), s(v)),
                        Op::Other => Op::Other,
                    })
                    .collect(),
            })
            .collect()
    }
}

/// Fills a versionstamp placeholder (`bytes` ends with its 4-byte
/// little-endian offset) with `version`'s stamp, order `order`.
pub fn fill_stamp(bytes: &[u8], version: u64, order: u16) -> Vec<u8> {
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let offset = u32::from_le_bytes(tail.try_into().unwrap()) as usize;
    let mut out = body.to_vec();
    out[offset..offset + 8].copy_from_slice(&version.to_be_bytes());
    out[offset + 8..offset + 10].copy_from_slice(&order.to_be_bytes());
    out
}

/// FoundationDB's ADD on a little-endian i64 (missing = 0).
pub fn add_value(old: Option<&[u8]>, delta: i64) -> Vec<u8> {
    let mut buf = [0u8; 8];
    if let Some(old) = old {
        let n = old.len().min(8);
        buf[..n].copy_from_slice(&old[..n]);
    }
    i64::from_le_bytes(buf).wrapping_add(delta).to_le_bytes().to_vec()
}

/// A plain file format for handing the shape to child processes.
pub fn encode(shape: &Shape) -> Vec<u8> {
    let mut out = Vec::new();
    let put = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    let put_n = |out: &mut Vec<u8>, n: u64| out.extend_from_slice(&n.to_le_bytes());
    put_n(&mut out, shape.marks.len() as u64);
    for m in &shape.marks {
        put(&mut out, m);
    }
    for kvs in [&shape.per_job, &shape.shared] {
        put_n(&mut out, kvs.len() as u64);
        for (k, v) in kvs {
            put(&mut out, k);
            put(&mut out, v);
        }
    }
    put_n(&mut out, shape.txs.len() as u64);
    for tx in &shape.txs {
        put_n(&mut out, tx.writes as u64);
        put_n(&mut out, tx.ops.len() as u64);
        for op in &tx.ops {
            let (tag, a, b, n): (u64, &[u8], &[u8], u64) = match op {
                Op::Get(k) => (0, k, &[], 0),
                Op::Range { begin, end, limit, reverse } => (1, begin, end, (*limit as u64) << 1 | *reverse as u64),
                Op::Set(k, v) => (2, k, v, 0),
                Op::Clear(k) => (3, k, &[], 0),
                Op::ClearRange(b, e) => (4, b, e, 0),
                Op::Add(k, d) => (5, k, &[], *d as u64),
                Op::ByteMax(k, v) => (6, k, v, 0),
                Op::StampKey(k, v) => (7, k, v, 0),
                Op::StampValue(k, v) => (8, k, v, 0),
                Op::Other => (9, &[], &[], 0),
            };
            put_n(&mut out, tag);
            put(&mut out, a);
            put(&mut out, b);
            put_n(&mut out, n);
        }
    }
    out
}

/// The inverse of [`encode`].
pub fn decode(input: &[u8]) -> Shape {
    let mut pos = 0usize;
    let num = |pos: &mut usize| {
        let v = u64::from_le_bytes(input[*pos..*pos + 8].try_into().unwrap());
        *pos += 8;
        v
    };
    let bytes = |pos: &mut usize| {
        let len = u32::from_le_bytes(input[*pos..*pos + 4].try_into().unwrap()) as usize;
        let b = input[*pos + 4..*pos + 4 + len].to_vec();
        *pos += 4 + len;
        b
    };
    let mut shape = Shape::default();
    for _ in 0..num(&mut pos) {
        shape.marks.push(bytes(&mut pos));
    }
    for which in 0..2 {
        for _ in 0..num(&mut pos) {
            let kv = (bytes(&mut pos), bytes(&mut pos));
            if which == 0 {
                shape.per_job.push(kv)
            } else {
                shape.shared.push(kv)
            }
        }
    }
    for _ in 0..num(&mut pos) {
        let writes = num(&mut pos) == 1;
        let mut tx = TxShape { writes, ops: Vec::new() };
        for _ in 0..num(&mut pos) {
            let tag = num(&mut pos);
            let (a, b) = (bytes(&mut pos), bytes(&mut pos));
            let x = num(&mut pos);
            tx.ops.push(match tag {
                0 => Op::Get(a),
                1 => Op::Range { begin: a, end: b, limit: (x >> 1) as usize, reverse: x & 1 == 1 },
                2 => Op::Set(a, b),
                3 => Op::Clear(a),
                4 => Op::ClearRange(a, b),
                5 => Op::Add(a, x as i64),
                6 => Op::ByteMax(a, b),
                7 => Op::StampKey(a, b),
                8 => Op::StampValue(a, b),
                _ => Op::Other,
            });
        }
        shape.txs.push(tx);
    }
    shape
}
