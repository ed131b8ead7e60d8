-- Which HTTP answers count as a delivery, per downstream consumer (issue 25):
-- '2xx' (any 2xx; a JSON body with a `code` must also say 0), '2xx-and-code'
-- (2xx and a JSON `code` of 0: seed 003's contract, strictly) or 'code' (the
-- body's `code` alone). Existing consumers take the default '2xx': a seed-003
-- downstream answering {"code": 0} or {"code": 1} is judged as before, and one
-- answering 204 or 200 {} is now a delivery instead of a retried failure.
ALTER TABLE downstream_consumers ADD COLUMN success VARCHAR(16) NOT NULL DEFAULT '2xx';
