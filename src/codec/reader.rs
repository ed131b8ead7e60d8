//! The decode hot path: a record's writer schema, resolved once per schema id.
//!
//! `schema_registry_converter`'s decoder looks the writer schema up in two
//! caches for every record, clones its resolved names (a map of every named
//! type, each name's strings) and then the record's own name. A consumer
//! decodes every record it reads, so [`WriterSchemas`] keeps, per schema id
//! seen, a reader built once from the schema the registry holds under that
//! id, and whether its record is a row change. The schema
//! itself is still fetched through that decoder (its cache, its errors), on
//! the first record of each id only.

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, RwLock};

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::ResolvedSchema;
use apache_avro::types::Value;

use super::{CodecError, row_change};

/// The writer schemas seen so far, by schema id.
#[derive(Default)]
pub(super) struct WriterSchemas {
    by_id: RwLock<HashMap<u32, Arc<WriterSchema>>>,
}

/// One writer schema, ready to read records with.
pub(super) struct WriterSchema {
    reader: GenericDatumReader<'static>,
    /// Written as a `cdc` row change (the generic envelope or a per-table schema).
    pub(super) is_row_change: bool,
}

impl WriterSchemas {
    /// The schema of `id`, if a record of it was read before.
    pub(super) fn get(&self, id: u32) -> Option<Arc<WriterSchema>> {
        self.by_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Resolves `schema` (the registry's schema of `id`) and keeps it.
    pub(super) fn insert(&self, id: u32, schema: &Schema) -> Result<Arc<WriterSchema>, CodecError> {
        // Leaked once per schema id a process sees (twice if two records of
        // a new id race here), as the registry client does: the reader
        // borrows it for the life of the process.
        let schema: &'static Schema = Box::leak(Box::new(schema.clone()));
        let resolved = ResolvedSchema::try_from(schema)
            .map_err(|e| CodecError::Avro(format!("cannot resolve the schema of id {id}: {e}")))?;
        let reader = GenericDatumReader::builder(schema)
            .resolved_writer_schemata(resolved)
            .build()
            .map_err(|e| {
                CodecError::Avro(format!("cannot read with the schema of id {id}: {e}"))
            })?;
        let name = match schema {
            Schema::Record(record) => Some(record.name.fullname(None)),
            _ => None,
        };
        let is_row_change = name
            .as_deref()
            .is_some_and(|n| n == row_change::CHANGE_RECORD || row_change::is_table_change(n));
        let writer = Arc::new(WriterSchema {
            reader,
            is_row_change,
        });
        self.by_id
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, writer.clone());
        Ok(writer)
    }
}

impl WriterSchema {
    /// Reads one Avro body (the bytes after the Confluent frame).
    pub(super) fn read(&self, body: &[u8]) -> Result<Value, CodecError> {
        self.reader
            .read_value(&mut Cursor::new(body))
            .map_err(|e| CodecError::Avro(format!("Could not transform bytes using schema ({e})")))
    }
}
