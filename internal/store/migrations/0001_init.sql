-- Every kind has the same shape: the key (space, name), the columns the
-- store compare-and-sets and pages on, the indexed filter columns, and the
-- full record as a serialized protobuf in data. uid, version and the times
-- are authoritative in their columns.
-- Placeholders in {{braces}} are filled per backend (see dialect in open.go).

CREATE TABLE spaces (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    PRIMARY KEY (space, name)
);

CREATE TABLE templates (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    phase       {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX templates_phase ON templates (phase, space, name);

CREATE TABLE actors (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    state       {{text}} NOT NULL,
    template    {{text}} NOT NULL,
    worker      {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX actors_state ON actors (state, space, name);
CREATE INDEX actors_template ON actors (template, space, name);
CREATE INDEX actors_worker ON actors (worker, space, name);

CREATE TABLE workers (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    node        {{text}} NOT NULL,
    pool        {{text}} NOT NULL,
    actor       {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX workers_node ON workers (node, space, name);
CREATE INDEX workers_pool ON workers (pool, space, name);
CREATE INDEX workers_actor ON workers (actor, space, name);

CREATE TABLE snapshots (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    actor_uid   {{text}} NOT NULL,
    node        {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX snapshots_actor_uid ON snapshots (actor_uid, space, name);
CREATE INDEX snapshots_node ON snapshots (node, space, name);

CREATE TABLE nodes (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    PRIMARY KEY (space, name)
);

CREATE TABLE actor_events (
    seq          {{serial}},
    actor_uid    {{text}} NOT NULL,
    time         {{time}} NOT NULL,
    from_state   {{text}} NOT NULL,
    to_state     {{text}} NOT NULL,
    reason       {{text}} NOT NULL,
    operation_id {{text}} NOT NULL,
    worker       {{text}} NOT NULL,
    duration_ns  BIGINT NOT NULL
);
CREATE INDEX actor_events_actor ON actor_events (actor_uid, seq);
