//! What `orderpipe cdc` knows about one column, and how its values become
//! the database's value in JSON (`docs/cdc.md`, "Column values").
//!
//! A [`Column`] comes from the binlog's table map (type, metadata bytes and
//! `binlog_row_metadata=FULL`'s optional metadata: signedness, charsets,
//! ENUM/SET labels, names, primary key: the truth when the row was written)
//! refined by `information_schema.COLUMNS` for what the table map cannot
//! say (UUID, INET6 and INET4 look like `BINARY(16)`/`BINARY(4)` there), or,
//! for `cdc snapshot`, from `information_schema.COLUMNS` alone. Both then
//! render through [`Column::json`], which takes a value in the shape the
//! server's binary protocol gives it (what the snapshot reads, and what
//! [`super::row_image`] decodes the binlog into): so the stream and the
//! snapshot give the same text for the same row.

use mysql_async::Value;
use serde_json::Value as Json;

/// A character set, as far as decoding text needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charset {
    /// utf8mb4, utf8mb3 (utf8) and ascii: UTF-8 bytes.
    Utf8,
    /// MariaDB's latin1, which is cp1252 (0x80 is €).
    Latin1,
    /// UCS-2 and UTF-16 (big-endian).
    Utf16,
    /// UTF-16 little-endian.
    Utf16Le,
    /// UTF-32 (big-endian).
    Utf32,
    /// `binary`: bytes, not text.
    Binary,
    /// Another charset (named): decoded as UTF-8 where it is, else hex.
    Other(String),
}

impl Charset {
    /// The charset of MariaDB's name for it (`information_schema`).
    pub fn named(name: &str) -> Self {
        match name.to_ascii_lowercase().as_str() {
            "utf8mb4" | "utf8mb3" | "utf8" | "ascii" => Self::Utf8,
            "latin1" => Self::Latin1,
            "ucs2" | "utf16" => Self::Utf16,
            "utf16le" => Self::Utf16Le,
            "utf32" => Self::Utf32,
            "binary" => Self::Binary,
            other => Self::Other(other.to_string()),
        }
    }

    /// `bytes` in this charset as text; None for bytes that are not (binary,
    /// or invalid).
    pub fn decode(&self, bytes: &[u8]) -> Option<String> {
        match self {
            Self::Utf8 | Self::Other(_) => std::str::from_utf8(bytes).ok().map(str::to_string),
            Self::Latin1 => Some(bytes.iter().map(|&b| cp1252(b)).collect()),
            Self::Utf16 | Self::Utf16Le => {
                let units: Vec<u16> = bytes
                    .chunks_exact(2)
                    .map(|c| match self {
                        Self::Utf16 => u16::from_be_bytes([c[0], c[1]]),
                        _ => u16::from_le_bytes([c[0], c[1]]),
                    })
                    .collect();
                bytes
                    .len()
                    .is_multiple_of(2)
                    .then(|| String::from_utf16(&units).ok())?
            }
            Self::Utf32 => bytes.len().is_multiple_of(4).then(|| {
                bytes
                    .chunks_exact(4)
                    .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                    .collect::<Option<String>>()
            })?,
            Self::Binary => None,
        }
    }
}

/// cp1252 (MariaDB's latin1): Latin-1 but for 0x80..0x9F; the five bytes
/// cp1252 leaves undefined map to the C1 controls, as in MariaDB.
fn cp1252(byte: u8) -> char {
    const HIGH: [u16; 32] = [
        0x20AC, 0x81, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
        0x2039, 0x0152, 0x8D, 0x017D, 0x8F, 0x90, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013,
        0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D, 0x017E, 0x0178,
    ];
    match byte {
        0x80..=0x9F => {
            char::from_u32(u32::from(HIGH[usize::from(byte - 0x80)])).unwrap_or('\u{FFFD}')
        }
        b => char::from(b),
    }
}

/// The type of a column, with what rendering its values needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// TINYINT (8), SMALLINT (16), MEDIUMINT (24), INT (32), BIGINT (64).
    Int { bits: u8, unsigned: bool },
    /// DECIMAL/NUMERIC.
    Decimal { precision: u8, scale: u8 },
    /// FLOAT (an f32).
    Float,
    /// DOUBLE/REAL.
    Double,
    /// BIT(n).
    Bit { bits: u8 },
    /// YEAR.
    Year,
    /// DATE.
    Date,
    /// DATETIME(fsp).
    DateTime { fsp: u8 },
    /// TIMESTAMP(fsp), in UTC.
    Timestamp { fsp: u8 },
    /// TIME(fsp).
    Time { fsp: u8 },
    /// CHAR, VARCHAR and the TEXTs in a character set (MariaDB's JSON is a LONGTEXT).
    Text { charset: Charset },
    /// The `binary` charset: BINARY(n) (`pad_to` n), VARBINARY, BLOBs.
    Bytes { pad_to: Option<usize> },
    /// ENUM, with its labels (from the table map; the snapshot reads labels).
    Enum {
        labels: Vec<Vec<u8>>,
        charset: Charset,
    },
    /// SET, with its labels.
    Set {
        labels: Vec<Vec<u8>>,
        charset: Charset,
    },
    /// MySQL's binary JSON (MariaDB's JSON is [`Kind::Text`]).
    Json,
    /// MariaDB's UUID.
    Uuid,
    /// MariaDB's INET6.
    Inet6,
    /// MariaDB's INET4.
    Inet4,
    /// The spatial types: the stored SRID and WKB.
    Geometry,
    /// A type this version does not know: the value as the server gives it.
    Unknown,
}

/// One column: its name, type and whether MariaDB computes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// `VIRTUAL GENERATED` or `STORED GENERATED` (information_schema's EXTRA), else None.
    pub generated: Option<String>,
}

/// A column's row of `information_schema.COLUMNS`, what [`Column::from_information_schema`] reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InformationSchemaColumn {
    /// COLUMN_NAME.
    pub name: String,
    /// DATA_TYPE, e.g. `mediumint`, `uuid`.
    pub data_type: String,
    /// COLUMN_TYPE, e.g. `mediumint(8) unsigned`.
    pub column_type: String,
    /// CHARACTER_SET_NAME.
    pub charset: Option<String>,
    /// CHARACTER_OCTET_LENGTH.
    pub octet_length: Option<u64>,
    /// NUMERIC_PRECISION.
    pub precision: Option<u64>,
    /// NUMERIC_SCALE.
    pub scale: Option<u64>,
    /// DATETIME_PRECISION.
    pub datetime_precision: Option<u64>,
    /// EXTRA (`VIRTUAL GENERATED`, `STORED GENERATED`, ...).
    pub extra: String,
}

/// The query of [`InformationSchemaColumn`]s of one table, in column order
/// (binds: schema, table).
pub const INFORMATION_SCHEMA_QUERY: &str = "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, \
     CHARACTER_OCTET_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, EXTRA \
     FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION";

impl InformationSchemaColumn {
    /// A row of [`INFORMATION_SCHEMA_QUERY`].
    pub fn from_row(row: &mysql_async::Row) -> Self {
        let text = |i: usize| -> Option<String> {
            match row.as_ref(i) {
                Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                Some(Value::Int(n)) => Some(n.to_string()),
                Some(Value::UInt(n)) => Some(n.to_string()),
                _ => None,
            }
        };
        let number = |i: usize| text(i).and_then(|t| t.parse().ok());
        Self {
            name: text(0).unwrap_or_default(),
            data_type: text(1).unwrap_or_default().to_ascii_lowercase(),
            column_type: text(2).unwrap_or_default().to_ascii_lowercase(),
            charset: text(3),
            octet_length: number(4),
            precision: number(5),
            scale: number(6),
            datetime_precision: number(7),
            extra: text(8).unwrap_or_default(),
        }
    }

    fn generated(&self) -> Option<String> {
        let extra = self.extra.to_ascii_uppercase();
        (extra.contains("VIRTUAL") || extra.contains("STORED") || extra.contains("PERSISTENT"))
            .then(|| self.extra.clone())
    }
}

impl Column {
    /// A column described by `information_schema.COLUMNS` alone (the snapshot).
    pub fn from_information_schema(info: &InformationSchemaColumn) -> Self {
        let unsigned = info.column_type.contains("unsigned");
        let fsp = info.datetime_precision.unwrap_or(0) as u8;
        let charset = || Charset::named(info.charset.as_deref().unwrap_or("binary"));
        let kind = match info.data_type.as_str() {
            "tinyint" => Kind::Int { bits: 8, unsigned },
            "smallint" => Kind::Int { bits: 16, unsigned },
            "mediumint" => Kind::Int { bits: 24, unsigned },
            "int" | "integer" => Kind::Int { bits: 32, unsigned },
            "bigint" => Kind::Int { bits: 64, unsigned },
            "decimal" | "numeric" => Kind::Decimal {
                precision: info.precision.unwrap_or(10) as u8,
                scale: info.scale.unwrap_or(0) as u8,
            },
            "float" => Kind::Float,
            "double" | "real" => Kind::Double,
            "bit" => Kind::Bit {
                bits: info.precision.unwrap_or(1) as u8,
            },
            "year" => Kind::Year,
            "date" => Kind::Date,
            "datetime" => Kind::DateTime { fsp },
            "timestamp" => Kind::Timestamp { fsp },
            "time" => Kind::Time { fsp },
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => match charset()
            {
                Charset::Binary => Kind::Bytes {
                    pad_to: (info.data_type == "char")
                        .then_some(info.octet_length)
                        .flatten()
                        .map(|n| n as usize),
                },
                charset => Kind::Text { charset },
            },
            "binary" => Kind::Bytes {
                pad_to: info.octet_length.map(|n| n as usize),
            },
            "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                Kind::Bytes { pad_to: None }
            }
            // The snapshot reads ENUM and SET as their labels.
            "enum" => Kind::Enum {
                labels: Vec::new(),
                charset: charset(),
            },
            "set" => Kind::Set {
                labels: Vec::new(),
                charset: charset(),
            },
            "json" => Kind::Json,
            "uuid" => Kind::Uuid,
            "inet6" => Kind::Inet6,
            "inet4" => Kind::Inet4,
            "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
            | "multipolygon" | "geometrycollection" => Kind::Geometry,
            _ => Kind::Unknown,
        };
        Self {
            name: info.name.clone(),
            kind,
            generated: info.generated(),
        }
    }

    /// The table map's description refined by `information_schema` (the
    /// MariaDB types the table map cannot tell, and generated columns).
    pub fn refined(mut self, info: Option<&InformationSchemaColumn>) -> Self {
        let Some(info) = info.filter(|i| i.name == self.name) else {
            return self;
        };
        self.generated = info.generated();
        let kind = match info.data_type.as_str() {
            "uuid" => Some(Kind::Uuid),
            "inet6" => Some(Kind::Inet6),
            "inet4" => Some(Kind::Inet4),
            _ => None,
        };
        if let (Some(kind), Kind::Bytes { .. } | Kind::Text { .. } | Kind::Unknown) =
            (kind.clone(), &self.kind)
        {
            self.kind = kind;
        }
        self
    }

    /// The column's value as JSON: the database's value (`docs/cdc.md`).
    /// `value` has the shape of the binary protocol (a snapshot's row, or
    /// [`super::row_image`]'s decoding of the binlog).
    pub fn json(&self, value: &Value) -> Json {
        render(&self.kind, value)
    }
}

pub use crate::codec::row_change::float_json;

/// An f64 as the shortest JSON number that reads back as it.
pub fn double_json(f: f64) -> Json {
    serde_json::Number::from_f64(f).map_or_else(|| Json::String(f.to_string()), Json::Number)
}

/// DECIMAL text with exactly `scale` fraction digits, as `CAST(x AS CHAR)`.
fn decimal_text(text: &str, scale: u8) -> String {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let scale = usize::from(scale);
    let mut frac: String = frac.chars().take(scale).collect();
    while frac.len() < scale {
        frac.push('0');
    }
    let zero = int == "0" && frac.bytes().all(|b| b == b'0');
    let sign = if negative && !zero { "-" } else { "" };
    if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

/// `.` and the first `fsp` digits of `micros` (nothing for fsp 0).
fn fraction(micros: u32, fsp: u8) -> String {
    if fsp == 0 {
        return String::new();
    }
    let digits = format!("{micros:06}");
    format!(".{}", &digits[..usize::from(fsp.min(6))])
}

/// A big-endian unsigned integer (BIT's bytes).
fn big_endian(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |n, &b| (n << 8) | u64::from(b))
}

fn render(kind: &Kind, value: &Value) -> Json {
    let text = |charset: &Charset, bytes: &[u8]| {
        charset
            .decode(bytes)
            .map_or_else(|| Json::String(crate::hex::prefixed(bytes)), Json::String)
    };
    match (kind, value) {
        (_, Value::NULL) => Json::Null,
        (Kind::Int { bits, unsigned }, Value::Int(_) | Value::UInt(_)) => {
            let raw = match value {
                Value::Int(n) => *n as u64,
                Value::UInt(n) => *n,
                _ => unreachable!(),
            };
            // The column's width and signedness decide, whatever sign the decoder gave.
            let bits = u32::from(*bits).min(64);
            let raw = if bits == 64 {
                raw
            } else {
                raw & ((1u64 << bits) - 1)
            };
            if *unsigned {
                Json::from(raw)
            } else {
                let shift = 64 - bits;
                Json::from(((raw << shift) as i64) >> shift)
            }
        }
        (Kind::Decimal { scale, .. }, Value::Bytes(b)) => {
            Json::String(decimal_text(&String::from_utf8_lossy(b), *scale))
        }
        (Kind::Float, Value::Float(f)) => float_json(*f),
        (Kind::Float, Value::Double(f)) => float_json(*f as f32),
        (Kind::Double, Value::Double(f)) => double_json(*f),
        (Kind::Double, Value::Float(f)) => double_json(f64::from(*f)),
        (Kind::Bit { .. }, Value::Bytes(b)) => Json::from(big_endian(b)),
        (Kind::Bit { .. } | Kind::Year, Value::Int(n)) => Json::from(*n),
        (Kind::Bit { .. } | Kind::Year, Value::UInt(n)) => Json::from(*n),
        (Kind::Year, Value::Bytes(b)) => String::from_utf8_lossy(b)
            .parse::<u64>()
            .map_or(Json::Null, Json::from),
        (Kind::Date, Value::Date(y, m, d, ..)) => Json::String(format!("{y:04}-{m:02}-{d:02}")),
        (Kind::DateTime { fsp } | Kind::Timestamp { fsp }, Value::Date(y, mo, d, h, mi, s, us)) => {
            let zone = if matches!(kind, Kind::Timestamp { .. }) {
                "Z"
            } else {
                ""
            };
            Json::String(format!(
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}{zone}",
                fraction(*us, *fsp)
            ))
        }
        (Kind::Time { fsp }, Value::Time(negative, days, h, m, s, us)) => {
            let hours = u64::from(*h) + u64::from(*days) * 24;
            let sign = if *negative { "-" } else { "" };
            Json::String(format!(
                "{sign}{hours:02}:{m:02}:{s:02}{}",
                fraction(*us, *fsp)
            ))
        }
        (Kind::Text { charset }, Value::Bytes(b)) => text(charset, b),
        (Kind::Bytes { pad_to }, Value::Bytes(b)) => {
            let mut bytes = b.clone();
            if let Some(n) = pad_to {
                bytes.resize(bytes.len().max(*n), 0);
            }
            Json::String(crate::hex::prefixed(&bytes))
        }
        (Kind::Enum { charset, .. } | Kind::Set { charset, .. }, Value::Bytes(b)) => {
            text(charset, b)
        }
        (Kind::Json, Value::Bytes(b)) => {
            serde_json::from_slice(b).unwrap_or_else(|_| text(&Charset::Utf8, b))
        }
        (Kind::Uuid | Kind::Inet6 | Kind::Inet4, Value::Bytes(b)) => text(&Charset::Utf8, b),
        (Kind::Geometry, Value::Bytes(b)) => Json::String(crate::hex::prefixed(b)),
        // Anything else: as the value says.
        (_, Value::Int(n)) => Json::from(*n),
        (_, Value::UInt(n)) => Json::from(*n),
        (_, Value::Float(f)) => float_json(*f),
        (_, Value::Double(f)) => double_json(*f),
        (_, Value::Bytes(b)) => text(&Charset::Utf8, b),
        (_, Value::Date(y, mo, d, h, mi, s, us)) => Json::String(format!(
            "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}",
            if *us > 0 {
                fraction(*us, 6)
            } else {
                String::new()
            }
        )),
        (_, Value::Time(negative, days, h, m, s, us)) => Json::String(format!(
            "{}{:02}:{m:02}:{s:02}{}",
            if *negative { "-" } else { "" },
            u64::from(*h) + u64::from(*days) * 24,
            if *us > 0 {
                fraction(*us, 6)
            } else {
                String::new()
            }
        )),
    }
}

/// The Avro type of a column's values in a per-table schema
/// (`value_format = "avro"`), as schema JSON; [`avro_value`] writes them.
pub fn avro_type(kind: &Kind) -> serde_json::Value {
    match kind {
        Kind::Int {
            bits: 64,
            unsigned: true,
        }
        | Kind::Bit { bits: 64 } => {
            serde_json::json!({"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0})
        }
        Kind::Int { .. } | Kind::Bit { .. } | Kind::Year => "long".into(),
        Kind::Float => "float".into(),
        Kind::Double => "double".into(),
        Kind::Bytes { .. } | Kind::Geometry => "bytes".into(),
        _ => "string".into(),
    }
}

/// The Avro value of a column's JSON form (what [`avro_type`] says); the
/// decoder turns it back into the same JSON. An error says why it does not fit.
pub fn avro_value(kind: &Kind, json: &Json) -> Result<apache_avro::types::Value, String> {
    use apache_avro::types::Value as Avro;
    Ok(match (avro_type(kind), json) {
        (serde_json::Value::Object(_), Json::Number(n)) => {
            let n = n
                .as_u64()
                .ok_or_else(|| format!("{n} is not an unsigned integer"))?;
            // Big-endian two's complement, with a leading zero byte so it stays positive.
            let mut bytes = n.to_be_bytes().to_vec();
            bytes.insert(0, 0);
            Avro::Decimal(apache_avro::Decimal::from(bytes))
        }
        (t, Json::Number(n)) if t == "long" => Avro::Long(
            n.as_i64()
                .ok_or_else(|| format!("{n} does not fit an Avro long"))?,
        ),
        (t, Json::Number(n)) if t == "float" => {
            Avro::Float(n.as_f64().ok_or("not a number")? as f32)
        }
        (t, Json::Number(n)) if t == "double" => Avro::Double(n.as_f64().ok_or("not a number")?),
        (t, Json::String(s)) if t == "bytes" => {
            let digits = s
                .strip_prefix("0x")
                .ok_or_else(|| format!("`{s}` is not 0x-hex"))?;
            let bytes = (0..digits.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(digits.get(i..i + 2).unwrap_or("x"), 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|_| format!("`{s}` is not 0x-hex"))?;
            Avro::Bytes(bytes)
        }
        (_, Json::String(s)) => Avro::String(s.clone()),
        (_, other) => Avro::String(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn col(kind: Kind) -> Column {
        Column {
            name: "c".into(),
            kind,
            generated: None,
        }
    }

    #[test]
    fn values_render_as_the_database_shows_them() {
        let int = |bits, unsigned| col(Kind::Int { bits, unsigned });
        // A 24-bit value read without its sign, and with the wrong one.
        assert_eq!(int(24, false).json(&Value::Int(8388608)), json!(-8388608));
        assert_eq!(int(24, true).json(&Value::Int(-1)), json!(16777215));
        assert_eq!(int(64, true).json(&Value::Int(-1)), json!(u64::MAX));
        assert_eq!(int(64, false).json(&Value::Int(i64::MIN)), json!(i64::MIN));
        let decimal = col(Kind::Decimal {
            precision: 5,
            scale: 2,
        });
        assert_eq!(
            decimal.json(&Value::Bytes(b"12.5".to_vec())),
            json!("12.50")
        );
        assert_eq!(decimal.json(&Value::Bytes(b"-.5".to_vec())), json!("-0.50"));
        assert_eq!(decimal.json(&Value::Bytes(b"-0".to_vec())), json!("0.00"));
        assert_eq!(
            col(Kind::Float).json(&Value::Float(1.23456)).to_string(),
            "1.23456"
        );
        assert_eq!(
            col(Kind::Double).json(&Value::Double(-0.0)).to_string(),
            "-0.0"
        );
        assert_eq!(
            col(Kind::Bit { bits: 64 }).json(&Value::Bytes(vec![0xff; 8])),
            json!(u64::MAX)
        );
        let dt3 = col(Kind::DateTime { fsp: 3 });
        assert_eq!(
            dt3.json(&Value::Date(2026, 12, 1, 6, 0, 0, 120_000)),
            json!("2026-12-01T06:00:00.120")
        );
        assert_eq!(
            dt3.json(&Value::Date(0, 0, 0, 0, 0, 0, 0)),
            json!("0000-00-00T00:00:00.000")
        );
        let ts0 = col(Kind::Timestamp { fsp: 0 });
        assert_eq!(
            ts0.json(&Value::Date(2025, 12, 1, 6, 0, 0, 0)),
            json!("2025-12-01T06:00:00Z")
        );
        let t2 = col(Kind::Time { fsp: 2 });
        assert_eq!(
            t2.json(&Value::Time(true, 34, 22, 59, 59, 990_000)),
            json!("-838:59:59.99")
        );
        let latin1 = col(Kind::Text {
            charset: Charset::Latin1,
        });
        assert_eq!(
            latin1.json(&Value::Bytes(vec![0x80, 0xe9, 0x81])),
            json!("€é\u{81}")
        );
        // Binary columns are hex whatever the bytes, BINARY(n) to its length.
        let binary = col(Kind::Bytes { pad_to: Some(4) });
        assert_eq!(
            binary.json(&Value::Bytes(b"ab".to_vec())),
            json!("0x61620000")
        );
        assert_eq!(
            col(Kind::Geometry).json(&Value::Bytes(vec![1])),
            json!("0x01")
        );
    }

    #[test]
    fn avro_values_that_do_not_fit_a_long_are_decimals() {
        let kind = Kind::Int {
            bits: 64,
            unsigned: true,
        };
        assert!(matches!(
            avro_value(&kind, &json!(u64::MAX)).unwrap(),
            apache_avro::types::Value::Decimal(_)
        ));
        assert_eq!(
            avro_type(&Kind::Int {
                bits: 64,
                unsigned: false
            }),
            json!("long")
        );
        assert_eq!(
            avro_value(&Kind::Bytes { pad_to: None }, &json!("0x00ff")).unwrap(),
            apache_avro::types::Value::Bytes(vec![0, 0xff])
        );
    }
}
