//! The Kafka ground floor: what every role needs to talk to Kafka and to
//! read or write a record's headers, with no knowledge of orders, groups'
//! handlers or the database.
//!
//! * [`client`]: the `[kafka]` settings, the base librdkafka config, the
//!   checked producer options and the measured producer.
//! * [`record`]: header names, reading and replacing headers, a record's
//!   failure history.

pub mod client;
pub mod record;
