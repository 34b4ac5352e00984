%% What the modules of the PropEr model test share (test/couch_workers_prop_tests.erl
%% says what is checked): the values a sequence draws from, and the model's records.

-define(TYPES, [a, b, c]).
-define(JOB_IDS, [<<"j1">>, <<"j2">>, <<"j1", 0>>, <<>>, <<0>>, <<"jobs">>]).
-define(WORKER_IDS, [<<"w1">>, <<"w2">>, <<"w1", 0>>, <<>>]).
-define(OWNERS, [1, 2, 3]).
-define(PRIORITIES, [0, 0, 0, 1, -1, 9223372036854775807, -9223372036854775808]).
-define(N_INFOS, 5).
-define(KEY_LIMIT, 10000).
-define(VALUE_LIMIT, 100000).
-define(SERVERS, [couch_workers_sup, couch_workers_events, couch_workers_global, couch_workers_local, couch_workers_jobs_subs]).

-record(job, {
    state = pending :: pending | running | finished | canceled | failed,
    worker = null :: null | binary(),
    prio = 0 :: integer(),
    info = 0 :: non_neg_integer(),
    result = null :: null | non_neg_integer(),
    attempts = 0 :: non_neg_integer(),
    cancel_req = false :: boolean(),
    %% FIFO position while pending: {transaction counter, index in it}
    seq = undefined :: undefined | {non_neg_integer(), non_neg_integer()},
    %% the accept (handle number) that holds it while running
    acc = undefined :: undefined | pos_integer(),
    max = 20 :: pos_integer(),
    %% the info number of the last failure's error; worker_lost for a death
    error = null :: null | non_neg_integer() | worker_lost,
    %% a resubmission waiting for the end of the run: {Info, Prio, Max}
    resub = undefined :: undefined | {non_neg_integer(), integer(), pos_integer()}
}).

-record(m, {
    %% {Type, WorkerId} => {Owner, OptsN}
    workers = #{} :: #{{atom(), binary()} => {pos_integer(), pos_integer()}},
    %% {Type, JobId} => #job{}
    jobs = #{} :: #{{atom(), binary()} => #job{}},
    %% Type => number of membership subscriptions
    subs = #{} :: #{atom() => pos_integer()},
    %% transactions that made jobs pending
    counter = 0 :: non_neg_integer(),
    %% accepts so far (handle numbers)
    accepts = 0 :: non_neg_integer(),
    %% handles given out: [{N, {Type, JobId}}], newest first, at most 12
    handles = [] :: [{pos_integer(), {atom(), binary()}}]
}).
