%% @doc Job calls inside the caller's erlfdb transaction (couch_jobs' `Tx'
%% argument): the job's writes land iff the caller's transaction commits,
%% and its reads join that transaction's conflict set.
%%
%% `Tx' is an erlfdb transaction, a map holding one under `tx' (fabric2's
%% `Db' map), or `undefined' (then the call is the own-transaction one of
%% `couch_workers'). The Rust core runs the call on a forwarding
%% transaction (the NIF crate's `jobs/in_tx.rs'); this process performs
%% each of its requests on `Tx', in order, answers its reads, and returns
%% its result. An erlfdb error in a read ends the call and is raised again
%% here, so that the caller's `erlfdb:transactional/2' retries it; an
%% erlfdb error in a write is raised again when the call ends. Only on
%% FoundationDB: `{error, fdb_only}' on the embedded store. The erlfdb
%% transaction must be on the node's cluster (nothing checks it).
-module(couch_workers_tx).

-export([add/5, get/3]).

-export_type([tx/0]).

%% An erlfdb transaction, or a map with one under `tx'.
-type tx() :: undefined | {erlfdb_transaction, reference()} | #{tx := {erlfdb_transaction, reference()}, _ => _}.

%% The request a call makes, as the NIF sends it.
-type request() ::
    {get, binary(), boolean()}
    | {get_range, binary(), binary(), non_neg_integer(), boolean(), boolean()}
    | get_read_version
    | {set | byte_max | set_versionstamped_key | set_versionstamped_value, binary(), binary()}
    | {add, binary(), binary()}
    | {clear | add_read_conflict_key, binary()}
    | {clear_range, binary(), binary()}.

%% An erlfdb error raised while performing a request: raised again at the
%% call's end.
-type failed() :: undefined | {error | throw | exit, term(), list()}.

-spec add(tx(), binary(), binary(), map(), map()) -> ok | {error, term()}.
add(undefined, Type, Id, Info, Opts) ->
    couch_workers:job_add(Type, Id, Info, Opts);
add(Tx, Type, Id, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Info), is_map(Opts) ->
    FdbTx = fdb_tx(Tx),
    case couch_workers_jobs:add_opts(Opts) of
        {ok, NifOpts} ->
            run(FdbTx, fun(Ref) -> couch_workers_nif:budgeted(job_tx_add, [Ref, Type, Id, Info, NifOpts]) end);
        {error, _} = Error ->
            Error
    end;
add(_Tx, _Type, _Id, _Info, _Opts) ->
    erlang:error(badarg).

-spec get(tx(), binary(), binary()) -> {ok, map()} | {error, term()}.
get(undefined, Type, Id) ->
    couch_workers:job_get(Type, Id);
get(Tx, Type, Id) when is_binary(Type), is_binary(Id) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref) -> couch_workers_nif:job_tx_get(Ref, Type, Id) end);
get(_Tx, _Type, _Id) ->
    erlang:error(badarg).

fdb_tx(#{tx := Tx}) -> fdb_tx(Tx);
fdb_tx({erlfdb_transaction, _} = Tx) -> Tx;
fdb_tx(_) -> erlang:error(badarg).

%% Starts the call and serves its requests until it ends.
run(Tx, Start) ->
    Ref = make_ref(),
    case Start(Ref) of
        {ok, Call} -> serve(Tx, Ref, Call, 0, undefined);
        {error, _} = Error -> Error
    end.

-spec serve(tuple(), reference(), reference(), non_neg_integer(), failed()) -> term().
serve(Tx, Ref, Call, Seq, Failed) ->
    receive
        {Ref, Seq, {done, Result}} ->
            case Failed of
                undefined -> Result;
                {Class, Reason, Stack} -> erlang:raise(Class, Reason, Stack)
            end;
        {Ref, Seq, Request} ->
            serve(Tx, Ref, Call, Seq + 1, perform(Tx, Call, Seq, Request, Failed))
    after couch_workers_app:call_timeout() ->
        erlang:error({couch_workers_tx, timeout})
    end.

-spec perform(tuple(), reference(), non_neg_integer(), request(), failed()) -> failed().
perform(Tx, Call, Seq, Request, Failed) ->
    try do(Tx, Request) of
        no_answer -> Failed;
        Answer -> answer(Call, Seq, Answer, Failed)
    catch
        error:{erlfdb_error, Code} = Reason:Stack ->
            Failed1 = first(Failed, {error, Reason, Stack}),
            case is_read(Request) of
                true -> answer(Call, Seq, {error, Code}, Failed1);
                false -> Failed1
            end
    end.

answer(Call, Seq, Answer, Failed) ->
    % false: the call ended meanwhile (its owner closed it); nothing waits.
    _ = couch_workers_nif:job_tx_answer(Call, Seq, Answer),
    Failed.

first(undefined, New) -> New;
first(Failed, _New) -> Failed.

is_read({get, _, _}) -> true;
is_read({get_range, _, _, _, _, _}) -> true;
is_read(get_read_version) -> true;
is_read(_) -> false.

do(Tx, {get, Key, false}) ->
    {value, erlfdb:wait(erlfdb:get(Tx, Key))};
do(Tx, {get, Key, true}) ->
    {value, erlfdb:wait(erlfdb:get_ss(Tx, Key))};
do(Tx, {get_range, Begin, End, Limit, Reverse, Snapshot}) ->
    {range, erlfdb:get_range(Tx, Begin, End, [{limit, Limit}, {reverse, Reverse}, {snapshot, Snapshot}])};
do(Tx, get_read_version) ->
    {version, erlfdb:wait(erlfdb:get_read_version(Tx))};
do(Tx, {set, Key, Value}) ->
    written(erlfdb:set(Tx, Key, Value));
do(Tx, {clear, Key}) ->
    written(erlfdb:clear(Tx, Key));
do(Tx, {clear_range, Begin, End}) ->
    written(erlfdb:clear_range(Tx, Begin, End));
do(Tx, {add, Key, Param}) ->
    written(erlfdb:add(Tx, Key, Param));
do(Tx, {byte_max, Key, Value}) ->
    written(erlfdb:byte_max(Tx, Key, Value));
do(Tx, {set_versionstamped_key, Key, Value}) ->
    written(erlfdb:set_versionstamped_key(Tx, Key, Value));
do(Tx, {set_versionstamped_value, Key, Value}) ->
    written(erlfdb:set_versionstamped_value(Tx, Key, Value));
do(Tx, {add_read_conflict_key, Key}) ->
    written(erlfdb:add_read_conflict_key(Tx, Key)).

written(_) -> no_answer.
