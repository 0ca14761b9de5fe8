//! Page geometry, the page header and its CRC32C, and the record codec.
//!
//! Every block of the page file starts with a 16-byte header:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `NLPG` |
//! | 4 | page kind (1 = graph records) |
//! | 5 | layout id (1 = ID layout) |
//! | 6..8 | records in this block (u16) |
//! | 8..12 | block number (u32), so a misplaced block is detected |
//! | 12..16 | CRC32C of the whole block with these four bytes taken as zero |
//!
//! A record is `[vector: dim × elem, zero-padded to 4 bytes][u32 degree]
//! [u32 × R neighbours]`, so every vector starts 4-byte aligned inside a
//! 4 KiB-aligned buffer. A graph-replicated record (Gorgeous) then carries
//! its packed lists; a coded record (AlayaLaser) carries its neighbours'
//! codes: `[FastScan-packed codes of the R slots, padded to 32]
//! [2 × f32 factors per slot]`, slot i coding neighbour i of the list; a
//! PQ-coded record (AiSAQ) carries `[R slots × m bytes]`, slot i the PQ
//! code of neighbour i. Records never straddle a page; a record larger
//! than a page occupies a block of whole consecutive pages. A decoupled
//! layout's record (DGAI) holds no vector (`[u32 degree][u32 × R]`); its
//! vectors follow the record blocks in vector pages (page kind 2), in ID
//! order, each 4-byte aligned.

#[cfg(target_endian = "big")]
compile_error!("nearline's index format is little-endian; big-endian targets are not supported");

/// Bytes of the block header.
pub const PAGE_HEADER_BYTES: usize = 16;
/// Magic at the start of every block.
pub const PAGE_MAGIC: [u8; 4] = *b"NLPG";
/// Page kind: graph records (vector + adjacency list).
pub const KIND_GRAPH: u8 = 1;
/// Layout id of the ID layout.
pub const LAYOUT_ID: u8 = 1;
/// Layout id of a shuffled layout (Starling's block shuffling): records are
/// placed through the id→location section.
pub const LAYOUT_SHUFFLED: u8 = 2;
/// Layout id of a graph-replicated layout (Gorgeous): records in ID order,
/// each carrying the adjacency lists of some of its neighbours.
pub const LAYOUT_REPLICATED: u8 = 3;
/// Layout id of a coded layout (AlayaLaser): records in ID order, each
/// carrying its neighbours' RaBitQ codes.
pub const LAYOUT_CODED: u8 = 4;
/// Layout id of a PQ-coded layout (AiSAQ): records in ID order, each
/// carrying its neighbours' PQ codes.
pub const LAYOUT_PQ_CODED: u8 = 5;
/// Layout id of a page graph (PageANN): records placed through the
/// id→location section, each carrying its share of its page's out-edges.
pub const LAYOUT_PAGE_GRAPH: u8 = 6;
/// Layout id of a decoupled layout (DGAI): topology records (adjacency
/// lists only) in ID order, then the vectors in pages of their own.
pub const LAYOUT_DECOUPLED: u8 = 7;
/// Page kind: vectors only (a decoupled layout's vector pages).
pub const KIND_VECTORS: u8 = 2;
/// Floats of per-neighbour factors a coded record stores (the estimator's
/// `add` and `rescale`; the error scale is not needed to route).
pub const CODE_FACTORS: usize = 2;

/// Where records sit in the page file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    pub page_size: usize,
    /// Bytes of a block: one page, or whole pages for records larger than a page.
    pub block_size: usize,
    pub record_size: usize,
    pub records_per_block: usize,
    pub n_blocks: u64,
    /// Bytes of the vector at the start of each record (unpadded).
    pub vector_bytes: usize,
    /// Offset of the degree field (vector bytes rounded up to 4).
    pub degree_offset: usize,
    pub max_degree: usize,
    /// Adjacency lists of neighbours each record carries (Gorgeous'
    /// graph-replicated records; 0 for plain records).
    pub packed: usize,
    /// Bytes of the neighbour-code region of a coded record (AlayaLaser;
    /// 0 for records without codes).
    pub codes: usize,
    /// Dimensions the neighbour codes cover (0 without codes).
    pub code_dims: usize,
    /// Bits per dimension of the neighbour codes (1, 2 or 4; 0 without codes).
    pub code_bits: usize,
    /// Bytes of each neighbour's PQ code in a PQ-coded record (AiSAQ; 0
    /// for records without PQ codes). Slot i of the code region holds the
    /// code of neighbour i, `pq_code` bytes each.
    pub pq_code: usize,
    /// Layout id every block header carries ([`LAYOUT_ID`],
    /// [`LAYOUT_SHUFFLED`] or [`LAYOUT_REPLICATED`]); a block of another
    /// layout is refused.
    pub layout_id: u8,
    /// Bytes of each vector in a decoupled layout's vector pages (DGAI; 0
    /// for layouts whose records hold their vectors). The records then
    /// hold no vector (`vector_bytes` is 0).
    pub split_vector_bytes: usize,
    /// Vectors a vector page holds (0 without vector pages).
    pub vectors_per_block: usize,
    /// Vector pages, after the `n_blocks` record blocks (0 without).
    pub vector_blocks: u64,
}

impl PageGeometry {
    /// Geometry for `n` records of `vector_bytes` plus an adjacency list of
    /// up to `max_degree` ids, on pages of `page_size` bytes.
    pub fn new(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        n: usize,
    ) -> crate::Result<Self> {
        Self::with_packed(page_size, vector_bytes, max_degree, 0, n)
    }

    /// Bytes a record's packed region takes for `packed` lists of degree
    /// bound `max_degree`: a count, the packed ids, then each list (degree
    /// and `max_degree` slots); 0 when nothing is packed.
    pub fn packed_bytes(max_degree: usize, packed: usize) -> Option<usize> {
        if packed == 0 {
            return Some(0);
        }
        let per = 8usize.checked_add(max_degree.checked_mul(4)?)?;
        4usize.checked_add(packed.checked_mul(per)?)
    }

    /// Geometry of records that also carry `packed` neighbours' adjacency
    /// lists (Gorgeous' graph-replicated layout; `packed` 0 gives plain
    /// records, as [`PageGeometry::new`]).
    pub fn with_packed(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        packed: usize,
        n: usize,
    ) -> crate::Result<Self> {
        Self::with_regions(page_size, vector_bytes, max_degree, packed, 0, 0, n)
    }

    /// Bytes of a coded record's neighbour-code region: the 1-bit codes of
    /// `max_degree` slots over `code_dims` dimensions of `code_bits` each,
    /// packed for FastScan (slots padded to 32, `ceil(dims · bits / 4)`
    /// groups), then [`CODE_FACTORS`] floats per slot.
    pub fn code_region_bytes(
        max_degree: usize,
        code_dims: usize,
        code_bits: usize,
    ) -> Option<usize> {
        if code_dims == 0 {
            return Some(0);
        }
        let groups = code_dims.checked_mul(code_bits)?.div_ceil(4);
        let packed = crate::quant::fastscan::packed_len(max_degree, groups).ok()?;
        packed.checked_add(max_degree.checked_mul(4 * CODE_FACTORS)?)
    }

    /// Geometry of records that carry their neighbours' codes over
    /// `code_dims` dimensions (AlayaLaser's coded layout).
    pub fn with_codes(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        code_dims: usize,
        code_bits: usize,
        n: usize,
    ) -> crate::Result<Self> {
        Self::with_regions(
            page_size,
            vector_bytes,
            max_degree,
            0,
            code_dims,
            code_bits,
            n,
        )
    }

    /// Geometry of records that carry their neighbours' PQ codes of
    /// `pq_bytes` bytes each (AiSAQ's layout): the code region is
    /// `max_degree × pq_bytes` bytes after the adjacency list.
    pub fn with_pq_codes(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        pq_bytes: usize,
        n: usize,
    ) -> crate::Result<Self> {
        if pq_bytes == 0 || pq_bytes > u16::MAX as usize {
            return Err(crate::Error::arg(format!(
                "neighbour PQ codes of {pq_bytes} bytes: expected 1..=65535"
            )));
        }
        Self::with_all(page_size, vector_bytes, max_degree, 0, 0, 0, pq_bytes, n)
    }

    /// The geometry of every layout: plain records, records with `packed`
    /// lists, or records with codes over `code_dims` dimensions (not both).
    pub fn with_regions(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        packed: usize,
        code_dims: usize,
        code_bits: usize,
        n: usize,
    ) -> crate::Result<Self> {
        Self::with_all(
            page_size,
            vector_bytes,
            max_degree,
            packed,
            code_dims,
            code_bits,
            0,
            n,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn with_all(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        packed: usize,
        code_dims: usize,
        code_bits: usize,
        pq_code: usize,
        n: usize,
    ) -> crate::Result<Self> {
        if code_dims > 0 && ![1, 2, 4].contains(&code_bits) {
            return Err(crate::Error::arg(format!(
                "neighbour codes have 1, 2 or 4 bits per dimension, not {code_bits}"
            )));
        }
        if packed > 0 && code_dims > 0 {
            return Err(crate::Error::arg(
                "a record carries packed lists or neighbour codes, not both",
            ));
        }
        if ![4096, 8192, 16384].contains(&page_size) {
            return Err(crate::Error::arg(format!(
                "page_size {page_size} is not supported: expected 4096, 8192 or 16384"
            )));
        }
        if max_degree == 0 || max_degree > u16::MAX as usize {
            return Err(crate::Error::arg(format!(
                "max degree R={max_degree} must be in 1..=65535"
            )));
        }
        // A damaged manifest can claim any dimension: overflow is an error.
        let too_large = || {
            crate::Error::arg(format!(
                "a record of {vector_bytes} vector bytes and R={max_degree} is too large"
            ))
        };
        let degree_offset = vector_bytes
            .checked_next_multiple_of(4)
            .ok_or_else(too_large)?;
        let codes = if pq_code > 0 {
            max_degree.checked_mul(pq_code).ok_or_else(too_large)?
        } else {
            Self::code_region_bytes(max_degree, code_dims, code_bits).ok_or_else(too_large)?
        };
        let record_size = degree_offset
            .checked_add(4 + 4 * max_degree)
            .and_then(|r| r.checked_add(Self::packed_bytes(max_degree, packed)?))
            .and_then(|r| r.checked_add(codes))
            .ok_or_else(too_large)?;
        let header_and_record = record_size
            .checked_add(PAGE_HEADER_BYTES)
            .ok_or_else(too_large)?;
        let (block_size, records_per_block) = if header_and_record <= page_size {
            let rpb = ((page_size - PAGE_HEADER_BYTES) / record_size).min(u16::MAX as usize);
            (page_size, rpb)
        } else {
            (
                header_and_record
                    .checked_next_multiple_of(page_size)
                    .ok_or_else(too_large)?,
                1,
            )
        };
        Ok(PageGeometry {
            page_size,
            block_size,
            record_size,
            records_per_block,
            n_blocks: (n as u64).div_ceil(records_per_block as u64),
            vector_bytes,
            degree_offset,
            max_degree,
            packed,
            codes,
            code_dims,
            code_bits: if code_dims > 0 { code_bits } else { 0 },
            pq_code,
            split_vector_bytes: 0,
            vectors_per_block: 0,
            vector_blocks: 0,
            layout_id: if packed > 0 {
                LAYOUT_REPLICATED
            } else if code_dims > 0 {
                LAYOUT_CODED
            } else if pq_code > 0 {
                LAYOUT_PQ_CODED
            } else {
                LAYOUT_ID
            },
        })
    }

    /// Geometry of a page graph (PageANN): the most records a page holds
    /// while their lists together still give the page at least
    /// `page_degree` out-edges, each record's list as long as the page's
    /// room allows. A record too large to share a page keeps plain
    /// geometry (its list is its page's).
    pub fn page_graph(
        page_size: usize,
        vector_bytes: usize,
        page_degree: usize,
        n: usize,
    ) -> crate::Result<Self> {
        let plain = Self::new(page_size, vector_bytes, page_degree, n)?;
        if plain.block_size > page_size {
            return Ok(plain.with_layout_id(LAYOUT_PAGE_GRAPH));
        }
        let room = page_size - PAGE_HEADER_BYTES;
        // A record's list bound when `rpb` records share the page.
        let degree_at = |rpb: usize| ((room / rpb).saturating_sub(plain.degree_offset + 4)) / 4;
        let mut rpb = plain.records_per_block;
        while degree_at(rpb + 1) >= 1 && (rpb + 1) * degree_at(rpb + 1) >= page_degree {
            rpb += 1;
        }
        let geo = Self::new(page_size, vector_bytes, degree_at(rpb).max(1), n)?;
        Ok(geo.with_layout_id(LAYOUT_PAGE_GRAPH))
    }

    /// Geometry of a decoupled layout (DGAI): records of an adjacency
    /// list only (at most `max_degree` ids), then `n` vectors of
    /// `vector_bytes` in pages of their own, each vector 4-byte aligned.
    /// Both kinds of page share one block size: one page, or whole pages
    /// when a vector does not fit one.
    pub fn decoupled(
        page_size: usize,
        vector_bytes: usize,
        max_degree: usize,
        n: usize,
    ) -> crate::Result<Self> {
        if vector_bytes == 0 {
            return Err(crate::Error::arg(
                "a decoupled layout stores vectors of at least one byte",
            ));
        }
        let topo = Self::new(page_size, 0, max_degree, n)?;
        let too_large = || {
            crate::Error::arg(format!(
                "a vector of {vector_bytes} bytes is too large for a vector page"
            ))
        };
        let stride = vector_bytes
            .checked_next_multiple_of(4)
            .ok_or_else(too_large)?;
        let need = stride
            .checked_add(PAGE_HEADER_BYTES)
            .ok_or_else(too_large)?;
        let block_size = need
            .checked_next_multiple_of(page_size)
            .ok_or_else(too_large)?
            .max(topo.block_size);
        let rpb = ((block_size - PAGE_HEADER_BYTES) / topo.record_size).min(u16::MAX as usize);
        let vpb = ((block_size - PAGE_HEADER_BYTES) / stride).min(u16::MAX as usize);
        Ok(PageGeometry {
            block_size,
            records_per_block: rpb,
            n_blocks: (n as u64).div_ceil(rpb as u64),
            split_vector_bytes: vector_bytes,
            vectors_per_block: vpb,
            vector_blocks: (n as u64).div_ceil(vpb as u64),
            layout_id: LAYOUT_DECOUPLED,
            ..topo
        })
    }

    /// Whether the vectors lie in vector pages of their own (a decoupled
    /// layout) rather than in the records.
    #[inline]
    pub fn decoupled_vectors(&self) -> bool {
        self.vector_blocks > 0
    }

    /// Bytes of a stored vector, wherever it lies.
    #[inline]
    pub fn stored_vector_bytes(&self) -> usize {
        if self.decoupled_vectors() {
            self.split_vector_bytes
        } else {
            self.vector_bytes
        }
    }

    /// Bytes between consecutive vectors of a vector page.
    #[inline]
    fn vector_stride(&self) -> usize {
        self.split_vector_bytes.next_multiple_of(4)
    }

    /// Block and slot of node `v`'s vector in a decoupled layout's vector
    /// pages (which follow the `n_blocks` record blocks).
    #[inline]
    pub fn vector_location(&self, v: u32) -> (u64, usize) {
        let vpb = self.vectors_per_block.max(1) as u64;
        let v = v as u64;
        (self.n_blocks + v / vpb, (v % vpb) as usize)
    }

    /// The vector at `slot` of a verified vector page.
    #[inline]
    pub fn vector_at<'a>(&self, block: &'a [u8], slot: usize) -> Result<&'a [u8], String> {
        if slot >= self.vectors_per_block {
            return Err(format!(
                "vector slot {slot} lies past the {} a vector page holds",
                self.vectors_per_block
            ));
        }
        let start = PAGE_HEADER_BYTES + slot * self.vector_stride();
        block
            .get(start..start + self.split_vector_bytes)
            .ok_or_else(|| format!("vector slot {slot} lies past the end of its block"))
    }

    /// Writes vector page `block_no` holding `vectors` (at most
    /// `vectors_per_block`, each `split_vector_bytes`) and seals it.
    pub fn write_vector_block<'v>(
        &self,
        block: &mut [u8],
        block_no: u64,
        vectors: impl ExactSizeIterator<Item = &'v [u8]>,
    ) -> Result<(), String> {
        let count = vectors.len();
        if count > self.vectors_per_block || block.len() < self.block_size {
            return Err(format!(
                "{count} vectors do not fit a vector page of {}",
                self.vectors_per_block
            ));
        }
        block.fill(0);
        let stride = self.vector_stride();
        for (i, x) in vectors.enumerate() {
            if x.len() != self.split_vector_bytes {
                return Err(format!(
                    "a vector of {} bytes, the layout stores {}",
                    x.len(),
                    self.split_vector_bytes
                ));
            }
            let at = PAGE_HEADER_BYTES + i * stride;
            block[at..at + x.len()].copy_from_slice(x);
        }
        seal_block_of_kind(block, block_no, count, self.layout_id, KIND_VECTORS);
        Ok(())
    }

    /// Out-edges a full page of a page graph holds.
    pub fn page_degree(&self) -> usize {
        self.records_per_block * self.max_degree
    }

    /// Offset of the packed region inside a record.
    #[inline]
    fn packed_offset(&self) -> usize {
        self.degree_offset + 4 + 4 * self.max_degree
    }

    /// FastScan groups of one neighbour code (0 without codes).
    #[inline]
    pub fn code_groups(&self) -> usize {
        (self.code_dims * self.code_bits).div_ceil(4)
    }

    /// Offset of the neighbour-code region inside a record (it follows the
    /// adjacency list; coded records pack no lists).
    #[inline]
    pub fn codes_offset(&self) -> usize {
        self.degree_offset + 4 + 4 * self.max_degree
    }

    /// The neighbours' adjacency lists a record carries (none for plain
    /// records). The error says what is wrong.
    #[inline]
    pub fn decode_packed<'a>(&self, rec: &'a [u8]) -> Result<Packed<'a>, String> {
        if self.packed == 0 {
            return Ok(Packed::EMPTY);
        }
        let o = self.packed_offset();
        let words: &[u32] = rec
            .get(o..self.record_size)
            .and_then(|b| bytemuck::try_cast_slice(b).ok())
            .ok_or_else(|| "record's packed region is short or misaligned".to_string())?;
        let count = words[0] as usize;
        if count > self.packed {
            return Err(format!(
                "record packs {count} adjacency lists, at most {} fit",
                self.packed
            ));
        }
        let ids = &words[1..1 + count];
        let lists = &words[1 + self.packed..];
        Ok(Packed {
            ids,
            lists,
            r: self.max_degree,
        })
    }

    /// Writes a record's packed region: the ids and lists of `packed`
    /// neighbours (at most [`PageGeometry::packed`]; extra ones are dropped).
    pub fn write_packed(&self, out: &mut [u8], packed: &[(u32, &[u32])]) {
        if self.packed == 0 {
            return;
        }
        let o = self.packed_offset();
        let count = packed.len().min(self.packed);
        let mut w = |at: usize, v: u32| out[at..at + 4].copy_from_slice(&v.to_le_bytes());
        w(o, count as u32);
        let lists = o + 4 + 4 * self.packed;
        let slot = 4 * (1 + self.max_degree);
        for (i, &(id, list)) in packed[..count].iter().enumerate() {
            w(o + 4 + 4 * i, id);
            let at = lists + i * slot;
            let deg = list.len().min(self.max_degree);
            w(at, deg as u32);
            for (j, &u) in list[..deg].iter().enumerate() {
                w(at + 4 + 4 * j, u);
            }
        }
    }

    /// Writes a PQ-coded record's code region (AiSAQ): slot i gets the
    /// `pq_code`-byte code of the record's neighbour i, in list order; the
    /// slots past the list are zero. The error says what does not fit.
    pub fn write_pq_codes<'c>(
        &self,
        rec: &mut [u8],
        codes: impl ExactSizeIterator<Item = &'c [u8]>,
    ) -> Result<(), String> {
        if self.pq_code == 0 {
            return Err("this layout's records carry no PQ codes".into());
        }
        if codes.len() > self.max_degree {
            return Err(format!(
                "{} neighbour codes, at most R = {} fit",
                codes.len(),
                self.max_degree
            ));
        }
        let o = self.codes_offset();
        let region = rec
            .get_mut(o..o + self.codes)
            .ok_or_else(|| "record's code region is short".to_string())?;
        region.fill(0);
        for (slot, code) in region.chunks_exact_mut(self.pq_code).zip(codes) {
            if code.len() != self.pq_code {
                return Err(format!(
                    "a neighbour's PQ code has {} bytes, the layout {}",
                    code.len(),
                    self.pq_code
                ));
            }
            slot.copy_from_slice(code);
        }
        Ok(())
    }

    /// The same geometry for blocks of layout `layout_id`.
    pub fn with_layout_id(self, layout_id: u8) -> Self {
        PageGeometry { layout_id, ..self }
    }

    /// Block and slot of node `v` in the ID layout.
    #[inline]
    pub fn location(&self, v: u32) -> (u64, usize) {
        let v = v as u64;
        let rpb = self.records_per_block as u64;
        (v / rpb, (v % rpb) as usize)
    }

    /// Byte offset of block `b` in the page file.
    #[inline]
    pub fn block_offset(&self, b: u64) -> u64 {
        b * self.block_size as u64
    }

    /// Size of the page file (saturating: a damaged manifest's node count
    /// can make it exceed `u64`, and no file is that long).
    pub fn file_bytes(&self) -> u64 {
        self.n_blocks
            .saturating_add(self.vector_blocks)
            .saturating_mul(self.block_size as u64)
    }

    /// The record at `slot` of a verified block.
    #[inline]
    pub fn record<'a>(&self, block: &'a [u8], slot: usize) -> &'a [u8] {
        let start = PAGE_HEADER_BYTES + slot * self.record_size;
        &block[start..start + self.record_size]
    }

    /// Decodes the record at `slot` of a verified block held in a 4-byte
    /// aligned buffer: its vector bytes and its neighbour ids. The error
    /// says what is wrong (a degree above R, a slot past the block, a
    /// misaligned buffer).
    #[inline]
    pub fn decode<'a>(&self, block: &'a [u8], slot: usize) -> Result<RecordView<'a>, String> {
        let start = PAGE_HEADER_BYTES + slot * self.record_size;
        let rec = block
            .get(start..start + self.record_size)
            .ok_or_else(|| format!("record slot {slot} lies past the end of its block"))?;
        self.decode_record(rec)
    }

    /// Decodes one record (see [`PageGeometry::decode`]).
    #[inline]
    pub fn decode_record<'a>(&self, rec: &'a [u8]) -> Result<RecordView<'a>, String> {
        let (vector, nbrs) = self
            .split_record(rec)
            .ok_or_else(|| format!("record has a degree above R = {}", self.max_degree))?;
        let neighbours: &[u32] = bytemuck::try_cast_slice(nbrs)
            .map_err(|e| format!("record is not 4-byte aligned in memory: {e:?}"))?;
        let codes = if self.codes > 0 {
            let o = self.codes_offset();
            rec.get(o..o + self.codes)
                .ok_or_else(|| "record's code region is short".to_string())?
        } else {
            &[]
        };
        Ok(RecordView {
            vector,
            neighbours,
            codes,
        })
    }

    /// Splits a record into its vector bytes and its neighbour-id bytes
    /// (read them with [`ids`]). `None` if the stored degree exceeds R.
    #[inline]
    pub fn split_record<'a>(&self, rec: &'a [u8]) -> Option<(&'a [u8], &'a [u8])> {
        let o = self.degree_offset;
        let deg = u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]) as usize;
        if deg > self.max_degree {
            return None;
        }
        Some((&rec[..self.vector_bytes], &rec[o + 4..o + 4 + 4 * deg]))
    }

    /// Writes a record: vector bytes, degree, neighbour ids (zero padding).
    pub fn write_record(&self, out: &mut [u8], vector: &[u8], nbrs: &[u32]) {
        let o = self.degree_offset;
        out[..vector.len()].copy_from_slice(vector);
        out[vector.len()..o].fill(0);
        let deg = nbrs.len().min(self.max_degree);
        out[o..o + 4].copy_from_slice(&(deg as u32).to_le_bytes());
        for (i, &v) in nbrs[..deg].iter().enumerate() {
            out[o + 4 + 4 * i..o + 8 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        out[o + 4 + 4 * deg..self.record_size].fill(0);
    }
}

/// A decoded record: the stored vector's bytes and the neighbour ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// `dim × element size` bytes.
    pub vector: &'a [u8],
    /// The adjacency list (at most R ids).
    pub neighbours: &'a [u32],
    /// The neighbours' codes of a coded record (empty otherwise): slot i
    /// codes `neighbours[i]`; see [`PageGeometry::code_region_bytes`].
    pub codes: &'a [u8],
}

/// The neighbours' adjacency lists a graph-replicated record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed<'a> {
    /// The packed neighbours' ids.
    pub ids: &'a [u32],
    /// Their lists, each a degree then `r` slots.
    lists: &'a [u32],
    r: usize,
}

impl<'a> Packed<'a> {
    /// No packed lists.
    pub const EMPTY: Packed<'static> = Packed {
        ids: &[],
        lists: &[],
        r: 0,
    };

    /// How many lists are packed.
    #[inline]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether none is.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The `i`-th packed neighbour and its adjacency list (`None` when its
    /// stored degree exceeds R).
    #[inline]
    pub fn get(&self, i: usize) -> Option<(u32, &'a [u32])> {
        let id = *self.ids.get(i)?;
        let at = i * (1 + self.r);
        let deg = *self.lists.get(at)? as usize;
        if deg > self.r {
            return None;
        }
        Some((id, self.lists.get(at + 1..at + 1 + deg)?))
    }
}

/// Records a verified block holds (its header's count).
#[inline]
pub fn block_records(block: &[u8]) -> usize {
    u16::from_le_bytes([block[6], block[7]]) as usize
}

/// Neighbour ids stored little-endian in `bytes`.
#[inline]
pub fn ids(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// CRC32C of a block with its checksum field taken as zero.
pub fn block_crc(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[..12]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[PAGE_HEADER_BYTES..])
}

/// Writes the header of block `block_no` of layout `layout_id` holding
/// `n_records` records and seals it with its CRC (the records must already
/// be in place).
pub fn seal_block(block: &mut [u8], block_no: u64, n_records: usize, layout_id: u8) {
    seal_block_of_kind(block, block_no, n_records, layout_id, KIND_GRAPH)
}

/// As [`seal_block`], for a block of page kind `kind`.
fn seal_block_of_kind(block: &mut [u8], block_no: u64, n_records: usize, layout_id: u8, kind: u8) {
    block[0..4].copy_from_slice(&PAGE_MAGIC);
    block[4] = kind;
    block[5] = layout_id;
    block[6..8].copy_from_slice(&(n_records as u16).to_le_bytes());
    block[8..12].copy_from_slice(&(block_no as u32).to_le_bytes());
    let crc = block_crc(block);
    block[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a block read from disk: magic, kind, layout, block number,
/// record count and CRC. The error says which check failed.
pub fn verify_block(block: &[u8], block_no: u64, geo: &PageGeometry) -> Result<(), String> {
    if block.len() < geo.block_size {
        return Err(format!(
            "block {block_no} is short: {} of {} bytes",
            block.len(),
            geo.block_size
        ));
    }
    let block = &block[..geo.block_size];
    if block[0..4] != PAGE_MAGIC {
        return Err(format!(
            "block {block_no} has a bad magic {:?}",
            &block[0..4]
        ));
    }
    // A decoupled layout's blocks past its record blocks are vector pages.
    let (kind, fit) = if geo.decoupled_vectors() && block_no >= geo.n_blocks {
        (KIND_VECTORS, geo.vectors_per_block)
    } else {
        (KIND_GRAPH, geo.records_per_block)
    };
    if block[4] != kind || block[5] != geo.layout_id {
        return Err(format!(
            "block {block_no} has page kind {} layout {}, expected {kind} and {}",
            block[4], block[5], geo.layout_id
        ));
    }
    let stored_no = u32::from_le_bytes([block[8], block[9], block[10], block[11]]);
    if stored_no != block_no as u32 {
        return Err(format!("block {block_no} claims to be block {stored_no}"));
    }
    let nrec = u16::from_le_bytes([block[6], block[7]]) as usize;
    if nrec > fit {
        return Err(format!(
            "block {block_no} claims {nrec} records, at most {fit} fit"
        ));
    }
    let stored = u32::from_le_bytes([block[12], block[13], block[14], block[15]]);
    let actual = block_crc(block);
    if stored != actual {
        return Err(format!("block {block_no} fails its CRC32C check (stored {stored:#010x}, computed {actual:#010x})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_small_and_large_records() {
        // 128-d f32, R=64: 512 + 4 + 256 = 772 B → 5 per 4 KiB page.
        let g = PageGeometry::new(4096, 512, 64, 1000).unwrap();
        assert_eq!(g.record_size, 772);
        assert_eq!(g.records_per_block, 5);
        assert_eq!(g.block_size, 4096);
        assert_eq!(g.n_blocks, 200);
        assert_eq!(g.location(7), (1, 2));
        // 1536-d f32 record (6 KiB+) spans two whole pages.
        let g = PageGeometry::new(4096, 6144, 64, 10).unwrap();
        assert_eq!(g.records_per_block, 1);
        assert_eq!(g.block_size, 8192);
        assert!(PageGeometry::new(3000, 16, 4, 1).is_err());
        assert!(PageGeometry::new(4096, 16, 0, 1).is_err());
    }

    #[test]
    fn a_decoupled_geometry_splits_lists_from_vectors() {
        // 384-d f32, R 64: 260-byte topology records, 15 a page; two
        // 1536-byte vectors a vector page, after the record blocks.
        let g = PageGeometry::decoupled(4096, 1536, 64, 1000).unwrap();
        assert_eq!((g.record_size, g.records_per_block), (260, 15));
        assert_eq!((g.vector_bytes, g.stored_vector_bytes()), (0, 1536));
        assert_eq!(
            (g.n_blocks, g.vectors_per_block, g.vector_blocks),
            (67, 2, 500)
        );
        assert_eq!(g.layout_id, LAYOUT_DECOUPLED);
        assert_eq!(g.file_bytes(), (67 + 500) * 4096);
        assert_eq!(g.vector_location(5), (67 + 2, 1));
        // A vector past a page: both kinds of block take two pages, and a
        // topology block then holds twice the lists.
        let g = PageGeometry::decoupled(4096, 6144, 64, 10).unwrap();
        assert_eq!((g.block_size, g.vectors_per_block), (8192, 1));
        assert_eq!(g.records_per_block, (8192 - PAGE_HEADER_BYTES) / 260);
        // Odd vector sizes are padded to 4 bytes in the vector page.
        let g = PageGeometry::decoupled(4096, 50, 8, 100).unwrap();
        assert_eq!(g.vectors_per_block, (4096 - PAGE_HEADER_BYTES) / 52);
        assert!(PageGeometry::decoupled(4096, 0, 8, 100).is_err());
        assert!(PageGeometry::decoupled(4096, 16, 0, 100).is_err());
    }

    proptest::proptest! {
        #[test]
        fn vector_pages_round_trip_and_detect_damage(
            vector_bytes in 1usize..9000,
            r in 1usize..80,
            n in 1usize..300,
            flip in 0usize..8192,
        ) {
            let g = PageGeometry::decoupled(4096, vector_bytes, r, n).unwrap();
            proptest::prop_assert!(g.records_per_block >= 1 && g.vectors_per_block >= 1);
            proptest::prop_assert_eq!(
                g.vector_blocks,
                (n as u64).div_ceil(g.vectors_per_block as u64)
            );
            let row = |v: usize| -> Vec<u8> {
                (0..vector_bytes).map(|i| (v * 31 + i * 7) as u8).collect()
            };
            let mut block = vec![0u8; g.block_size];
            for i in 0..g.vector_blocks {
                let b = g.n_blocks + i;
                let first = i as usize * g.vectors_per_block;
                let rows: Vec<Vec<u8>> =
                    (first..(first + g.vectors_per_block).min(n)).map(row).collect();
                g.write_vector_block(&mut block, b, rows.iter().map(|x| x.as_slice()))
                    .unwrap();
                proptest::prop_assert!(verify_block(&block, b, &g).is_ok());
                // A vector page is not a record page, nor another block.
                proptest::prop_assert!(verify_block(&block, b + 1, &g).is_err());
                if b > 0 {
                    proptest::prop_assert!(verify_block(&block, g.n_blocks - 1, &g).is_err());
                }
                for (j, x) in rows.iter().enumerate() {
                    let v = (first + j) as u32;
                    proptest::prop_assert_eq!(g.vector_location(v), (b, j));
                    proptest::prop_assert_eq!(g.vector_at(&block, j).unwrap(), x.as_slice());
                }
                let mut bad = block.clone();
                bad[flip % g.block_size] ^= 0x01;
                proptest::prop_assert!(verify_block(&bad, b, &g).is_err());
            }
            proptest::prop_assert!(g.vector_at(&block, g.vectors_per_block).is_err());
        }
    }

    #[test]
    fn a_page_graph_packs_more_records_while_its_page_keeps_r_edges() {
        // 128-d f32, R 64: 7 records of 512 + 4 + 4·16 = 580 B (plain: 5),
        // 112 edges a page.
        let g = PageGeometry::page_graph(4096, 512, 64, 1000).unwrap();
        assert_eq!((g.records_per_block, g.max_degree), (7, 16));
        assert_eq!(g.page_degree(), 112);
        assert_eq!(g.layout_id, LAYOUT_PAGE_GRAPH);
        assert!(g.records_per_block * g.record_size + PAGE_HEADER_BYTES <= 4096);
        // 50-d f32: 18 records of 5 edges (19 would leave 2 each, 38 < 64).
        let g = PageGeometry::page_graph(4096, 200, 64, 1000).unwrap();
        assert_eq!((g.records_per_block, g.max_degree), (18, 5));
        // 384-d f32: still 2 a page, each list as long as the page allows.
        let g = PageGeometry::page_graph(4096, 1536, 64, 1000).unwrap();
        assert_eq!((g.records_per_block, g.max_degree), (2, 125));
        // Geometry re-derived from the manifest's record degree agrees.
        let again = PageGeometry::new(4096, 1536, 125, 1000).unwrap();
        assert_eq!(again.records_per_block, 2);
        // A record past a page: one a block, its list the page's.
        let g = PageGeometry::page_graph(4096, 6144, 64, 10).unwrap();
        assert_eq!(
            (g.records_per_block, g.max_degree, g.block_size),
            (1, 64, 8192)
        );
    }

    #[test]
    fn pq_coded_records_hold_one_code_a_slot() {
        // 384-d f32, R 64, 96-byte codes: 1,796 + 6,144 = 7,940 B, an 8 KiB block.
        let g = PageGeometry::with_pq_codes(4096, 1536, 64, 96, 10).unwrap();
        assert_eq!(
            (g.record_size, g.block_size, g.records_per_block),
            (7940, 8192, 1)
        );
        assert_eq!(
            (g.pq_code, g.codes, g.layout_id),
            (96, 64 * 96, LAYOUT_PQ_CODED)
        );
        assert_eq!((g.code_dims, g.code_bits, g.packed), (0, 0, 0));
        assert!(PageGeometry::with_pq_codes(4096, 1536, 64, 0, 10).is_err());
        // Small records share a page.
        let g = PageGeometry::with_pq_codes(4096, 32, 8, 4, 100).unwrap();
        assert_eq!(g.record_size, 32 + 4 + 32 + 32);
        assert_eq!(g.records_per_block, (4096 - PAGE_HEADER_BYTES) / 100);
        let mut rec = vec![0xAAu8; g.record_size];
        g.write_record(&mut rec, &[1u8; 32], &[3, 1]);
        let (a, b) = ([1u8, 2, 3, 4], [5u8, 6, 7, 8]);
        g.write_pq_codes(&mut rec, [&a[..], &b[..]].into_iter())
            .unwrap();
        let mut block = vec![0u8; g.block_size];
        block[PAGE_HEADER_BYTES..PAGE_HEADER_BYTES + g.record_size].copy_from_slice(&rec);
        let r = g.decode(&block, 0).unwrap();
        assert_eq!(r.neighbours, &[3, 1]);
        assert_eq!(&r.codes[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(r.codes[8..].iter().all(|&x| x == 0));
        // Too many codes, a code of the wrong size, or a layout without PQ
        // codes are refused.
        let nine = vec![&a[..]; 9];
        assert!(g.write_pq_codes(&mut rec, nine.into_iter()).is_err());
        assert!(g.write_pq_codes(&mut rec, [&a[..3]].into_iter()).is_err());
        let plain = PageGeometry::new(4096, 32, 8, 100).unwrap();
        assert!(plain
            .write_pq_codes(&mut rec, [&a[..]].into_iter())
            .is_err());
    }

    #[test]
    fn crc_detects_any_flipped_byte() {
        let g = PageGeometry::new(4096, 64, 8, 100).unwrap();
        let mut b = vec![0u8; 4096];
        for (i, x) in b.iter_mut().enumerate().skip(PAGE_HEADER_BYTES) {
            *x = (i * 31 % 251) as u8;
        }
        seal_block(&mut b, 3, g.records_per_block, LAYOUT_ID);
        assert!(verify_block(&b, 3, &g).is_ok());
        assert!(verify_block(&b, 4, &g)
            .unwrap_err()
            .contains("claims to be block 3"));
        for pos in [0usize, 5, 13, 16, 100, 4095] {
            let mut c = b.clone();
            c[pos] ^= 0x40;
            assert!(verify_block(&c, 3, &g).is_err(), "flip at {pos} undetected");
        }
        assert!(verify_block(&b[..100], 3, &g).is_err());
    }

    #[test]
    fn split_record_rejects_oversized_degree() {
        let g = PageGeometry::new(4096, 8, 4, 1).unwrap();
        let mut rec = vec![0u8; g.record_size];
        g.write_record(&mut rec, &[1u8; 8], &[7, 9]);
        let (v, nb) = g.split_record(&rec).unwrap();
        assert_eq!(v, &[1u8; 8]);
        assert_eq!(ids(nb).collect::<Vec<_>>(), vec![7, 9]);
        // A 3-byte vector is padded so the degree stays aligned.
        let g3 = PageGeometry::new(4096, 3, 4, 1).unwrap();
        assert_eq!(g3.degree_offset, 4);
        rec[8..12].copy_from_slice(&5u32.to_le_bytes());
        assert!(g.split_record(&rec).is_none());
    }
}
