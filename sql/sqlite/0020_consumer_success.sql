-- Which HTTP answers count as a delivery, per downstream consumer: see sql/mysql/0020.
ALTER TABLE downstream_consumers ADD COLUMN success VARCHAR(16) NOT NULL DEFAULT '2xx';
