//! The row images of a binlog rows event, decoded into the values the
//! server's binary protocol would give for them (what `cdc snapshot`
//! reads), so that [`super::column::Column::json`] renders both alike.
//!
//! Why not mysql_common's own row decoding: it gives ENUM as its index, SET
//! as a bitmask, YEAR as `1900 + y` text (1900 for YEAR 0000), TIMESTAMP as
//! `secs[.usec]` text, and it panics on a negative `TIME(1)`/`TIME(2)` with
//! a fraction (an unsigned subtraction in `my_time_packed_from_binary`). Here
//! each value is read from the image with the table map's metadata bytes and
//! the column's [`Kind`]; mysql_common's DECIMAL, DATETIME2 and TIMESTAMP2
//! readers are reused.

use std::io::{self, Read};

use chrono::{DateTime, Datelike, Timelike};
use mysql_async::Value;
use mysql_async::binlog::events::{RowsEventData, TableMapEvent};
use mysql_async::consts::ColumnType;
use mysql_common::binlog::misc::{
    datetime_from_packed, my_datetime_packed_from_binary, my_packed_time_make,
    my_packed_time_make_int, my_timestamp_from_binary, time_from_packed,
};

use super::column::{Column, Kind};

/// One row of a rows event: the image before (updates, deletes) and after
/// (inserts, updates), a value per column of the table (None: not in the image).
pub type Images = (Option<Vec<Option<Value>>>, Option<Vec<Option<Value>>>);

/// Decodes every row of `rows` (of the table `tme` maps, described by `columns`).
pub fn rows(
    rows: &RowsEventData<'_>,
    tme: &TableMapEvent<'_>,
    columns: &[Column],
) -> io::Result<Vec<Images>> {
    let count = rows.num_columns() as usize;
    let before: Option<Vec<bool>> = rows
        .columns_before_image()
        .map(|b| (0..count).map(|i| b.get(i).is_some_and(|x| *x)).collect());
    let after: Option<Vec<bool>> = rows
        .columns_after_image()
        .map(|b| (0..count).map(|i| b.get(i).is_some_and(|x| *x)).collect());
    let mut data = rows.rows_data();
    let mut out = Vec::new();
    while !data.is_empty() {
        let mut image = |present: &Option<Vec<bool>>| -> io::Result<Option<Vec<Option<Value>>>> {
            present
                .as_ref()
                .map(|p| image(&mut data, p, tme, columns))
                .transpose()
        };
        let b = image(&before)?;
        let a = image(&after)?;
        if b.is_none() && a.is_none() {
            break;
        }
        out.push((b, a));
    }
    Ok(out)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// One row image: the null bitmap of the present columns, then their values.
fn image(
    data: &mut &[u8],
    present: &[bool],
    tme: &TableMapEvent<'_>,
    columns: &[Column],
) -> io::Result<Vec<Option<Value>>> {
    let in_image = present.iter().filter(|p| **p).count();
    let mut nulls = vec![0u8; in_image.div_ceil(8)];
    data.read_exact(&mut nulls)?;
    let mut values = Vec::with_capacity(present.len());
    let mut index = 0;
    for (i, &here) in present.iter().enumerate() {
        if !here {
            values.push(None);
            continue;
        }
        let null = nulls[index / 8] & (1 << (index % 8)) != 0;
        index += 1;
        if null {
            values.push(Some(Value::NULL));
            continue;
        }
        let column_type = tme
            .get_column_type(i)
            .map_err(|e| bad(format!("column {i}: {e}")))?
            .ok_or_else(|| bad(format!("column {i} has no type")))?;
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        let kind = columns.get(i).map_or(&Kind::Unknown, |c| &c.kind);
        let value = value(data, column_type, meta, kind).map_err(|e| {
            bad(format!(
                "column {} ({column_type:?}): {e}",
                columns.get(i).map_or("?", |c| c.name.as_str())
            ))
        })?;
        values.push(Some(value));
    }
    Ok(values)
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
    if data.len() < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

fn uint_le(data: &mut &[u8], n: usize) -> io::Result<u64> {
    Ok(take(data, n)?
        .iter()
        .rev()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b)))
}

fn uint_be(data: &mut &[u8], n: usize) -> io::Result<u64> {
    Ok(take(data, n)?
        .iter()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b)))
}

/// The bytes of a length-prefixed value (`prefix` bytes of little-endian length).
fn prefixed(data: &mut &[u8], prefix: usize) -> io::Result<Vec<u8>> {
    let n = uint_le(data, prefix)? as usize;
    Ok(take(data, n)?.to_vec())
}

/// A TIME2 value: `my_time_packed_from_binary` without its overflow on
/// negative values with one or two fraction digits.
fn time2(data: &mut &[u8], dec: u8) -> io::Result<i64> {
    const INT_OFS: i64 = 0x80_0000;
    let packed = match dec {
        1 | 2 => {
            let mut int = uint_be(data, 3)? as i64 - INT_OFS;
            let mut frac = uint_be(data, 1)? as i64;
            if int < 0 && frac > 0 {
                int += 1;
                frac -= 0x100;
            }
            my_packed_time_make(int, frac * 10_000)
        }
        3 | 4 => {
            let mut int = uint_be(data, 3)? as i64 - INT_OFS;
            let mut frac = uint_be(data, 2)? as i64;
            if int < 0 && frac > 0 {
                int += 1;
                frac -= 0x1_0000;
            }
            my_packed_time_make(int, frac * 100)
        }
        5 | 6 => uint_be(data, 6)? as i64 - 0x8000_0000_0000,
        _ => my_packed_time_make_int(uint_be(data, 3)? as i64 - INT_OFS),
    };
    Ok(packed)
}

/// A UUID's 16 bytes as MariaDB shows them. MariaDB 10.11 stores some
/// UUIDs with their time fields swapped in the record, but the binlog
/// carries the bytes in text order (checked on the dev stack with a
/// version-1 UUID, `tests/it/cdc_types.rs`).
fn uuid_text(bytes: &[u8]) -> String {
    let mut octets = [0u8; 16];
    octets[..bytes.len().min(16)].copy_from_slice(&bytes[..bytes.len().min(16)]);
    uuid::Uuid::from_bytes(octets).hyphenated().to_string()
}

/// One value of the image.
fn value(data: &mut &[u8], column_type: ColumnType, meta: &[u8], kind: &Kind) -> io::Result<Value> {
    use ColumnType::*;
    let meta_at = |i: usize| meta.get(i).copied().unwrap_or(0);
    Ok(match column_type {
        MYSQL_TYPE_TINY => Value::Int(uint_le(data, 1)? as i64),
        MYSQL_TYPE_SHORT => Value::Int(uint_le(data, 2)? as i64),
        MYSQL_TYPE_INT24 => Value::Int(uint_le(data, 3)? as i64),
        MYSQL_TYPE_LONG => Value::Int(uint_le(data, 4)? as i64),
        // Bits as read; Column::json applies the width and signedness.
        MYSQL_TYPE_LONGLONG => Value::UInt(uint_le(data, 8)?),
        MYSQL_TYPE_FLOAT => Value::Float(f32::from_bits(uint_le(data, 4)? as u32)),
        MYSQL_TYPE_DOUBLE => Value::Double(f64::from_bits(uint_le(data, 8)?)),
        MYSQL_TYPE_NEWDECIMAL => {
            let decimal = mysql_common::binlog::decimal::Decimal::read_bin(
                &mut *data,
                usize::from(meta_at(0)),
                usize::from(meta_at(1)),
                false,
            )?;
            Value::Bytes(decimal.to_string().into_bytes())
        }
        MYSQL_TYPE_YEAR => match uint_le(data, 1)? {
            0 => Value::Int(0),
            y => Value::Int(1900 + y as i64),
        },
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => {
            let v = uint_le(data, 3)?;
            Value::Date(
                (v >> 9) as u16,
                ((v >> 5) & 15) as u8,
                (v & 31) as u8,
                0,
                0,
                0,
                0,
            )
        }
        MYSQL_TYPE_TIME => {
            // The old TIME: HHMMSS as a signed 24-bit integer.
            let raw = uint_le(data, 3)? as i64;
            let v = (raw << 40) >> 40;
            let (negative, v) = (v < 0, v.unsigned_abs());
            let hours = (v / 10_000) as u32;
            Value::Time(
                negative,
                hours / 24,
                (hours % 24) as u8,
                ((v / 100) % 100) as u8,
                (v % 100) as u8,
                0,
            )
        }
        MYSQL_TYPE_TIME2 => time_from_packed(time2(data, meta_at(0))?),
        MYSQL_TYPE_DATETIME => {
            let v = uint_le(data, 8)?;
            let (d, t) = (v / 1_000_000, v % 1_000_000);
            Value::Date(
                (d / 10_000) as u16,
                ((d / 100) % 100) as u8,
                (d % 100) as u8,
                (t / 10_000) as u8,
                ((t / 100) % 100) as u8,
                (t % 100) as u8,
                0,
            )
        }
        MYSQL_TYPE_DATETIME2 => datetime_from_packed(my_datetime_packed_from_binary(
            &mut *data,
            u32::from(meta_at(0)),
        )?),
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => {
            let (secs, micros) = if column_type == MYSQL_TYPE_TIMESTAMP {
                (uint_le(data, 4)? as u32, 0)
            } else {
                let (s, us) = my_timestamp_from_binary(&mut *data, meta_at(0))?;
                (s as u32, us.max(0) as u32)
            };
            // 0 is the zero TIMESTAMP (0000-00-00 00:00:00), not the epoch.
            if secs == 0 && micros == 0 {
                Value::Date(0, 0, 0, 0, 0, 0, 0)
            } else {
                let at = DateTime::from_timestamp(i64::from(secs), micros * 1000)
                    .ok_or_else(|| bad(format!("TIMESTAMP {secs}.{micros:06}")))?;
                Value::Date(
                    at.year() as u16,
                    at.month() as u8,
                    at.day() as u8,
                    at.hour() as u8,
                    at.minute() as u8,
                    at.second() as u8,
                    micros,
                )
            }
        }
        MYSQL_TYPE_BIT => {
            let bits = usize::from(meta_at(1)) * 8 + usize::from(meta_at(0));
            Value::Bytes(take(data, bits.div_ceil(8))?.to_vec())
        }
        MYSQL_TYPE_ENUM => {
            let index = uint_le(data, usize::from(meta_at(1)).clamp(1, 2))? as usize;
            match kind {
                // 0 is the empty value MariaDB stores for an invalid one.
                Kind::Enum { labels, .. } => Value::Bytes(
                    index
                        .checked_sub(1)
                        .and_then(|i| labels.get(i))
                        .cloned()
                        .unwrap_or_default(),
                ),
                _ => Value::UInt(index as u64),
            }
        }
        MYSQL_TYPE_SET => {
            let bytes = usize::from(meta_at(1)).clamp(1, 8);
            let mask = uint_le(data, bytes)?;
            match kind {
                Kind::Set { labels, .. } => {
                    let chosen: Vec<&[u8]> = labels
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i < 64 && mask & (1u64 << i) != 0)
                        .map(|(_, l)| l.as_slice())
                        .collect();
                    Value::Bytes(chosen.join(&b","[..]))
                }
                _ => Value::UInt(mask),
            }
        }
        MYSQL_TYPE_BLOB
        | MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB
        | MYSQL_TYPE_GEOMETRY => Value::Bytes(prefixed(data, usize::from(meta_at(0)).clamp(1, 4))?),
        MYSQL_TYPE_JSON => Value::Bytes(json_text(&prefixed(
            data,
            usize::from(meta_at(0)).clamp(1, 4),
        )?)?),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => {
            let max = usize::from(meta_at(0)) | (usize::from(meta_at(1)) << 8);
            string_kind(prefixed(data, if max < 256 { 1 } else { 2 })?, kind)
        }
        MYSQL_TYPE_STRING => {
            let max = string_length(meta);
            string_kind(prefixed(data, if max < 256 { 1 } else { 2 })?, kind)
        }
        other => return Err(bad(format!("cannot decode a {other:?} value"))),
    })
}

/// The byte length of a `MYSQL_TYPE_STRING` column (CHAR, BINARY) from
/// its table map metadata: the real type and the length share the two
/// bytes (MySQL bug #37426).
pub(crate) fn string_length(meta: &[u8]) -> usize {
    let byte0 = usize::from(meta.first().copied().unwrap_or(0));
    let byte1 = usize::from(meta.get(1).copied().unwrap_or(0));
    if byte0 & 0x30 != 0x30 {
        byte1 | (((byte0 & 0x30) ^ 0x30) << 4)
    } else {
        byte1
    }
}

/// A string-typed value of a MariaDB type stored as bytes (UUID, INET6,
/// INET4 are BINARY(16)/BINARY(4) in the table map) as the server shows it.
fn string_kind(bytes: Vec<u8>, kind: &Kind) -> Value {
    let mut full = bytes;
    match kind {
        Kind::Uuid => {
            full.resize(16, 0);
            Value::Bytes(uuid_text(&full).into_bytes())
        }
        Kind::Inet6 => {
            full.resize(16, 0);
            let octets: [u8; 16] = full[..16].try_into().expect("16 bytes");
            Value::Bytes(std::net::Ipv6Addr::from(octets).to_string().into_bytes())
        }
        Kind::Inet4 => {
            full.resize(4, 0);
            let octets: [u8; 4] = full[..4].try_into().expect("4 bytes");
            Value::Bytes(std::net::Ipv4Addr::from(octets).to_string().into_bytes())
        }
        _ => Value::Bytes(full),
    }
}

/// MySQL's binary JSON as JSON text.
fn json_text(bytes: &[u8]) -> io::Result<Vec<u8>> {
    let value: mysql_common::binlog::jsonb::Value<'_> =
        mysql_common::io::ParseBuf(bytes).parse(())?;
    let json = serde_json::Value::try_from(value).map_err(|e| bad(e.to_string()))?;
    Ok(json.to_string().into_bytes())
}
