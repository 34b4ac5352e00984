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
%% here, so that the caller's `erlfdb:transactional/2' retries it (or, for
%% one it does not retry, such as a committed or cancelled `Tx', raises
%% it to the caller); an erlfdb error in a write is raised again when the
%% call ends. Only on FoundationDB: `{error, fdb_only}' on the embedded
%% store. Every call first checks that `Tx' is on the app's cluster
%% (`{error, wrong_cluster}' otherwise, nothing read or written).
%%
%% A call whose core stops answering for the API's call timeout is closed
%% (its reads fail, its task ends) and raises `{couch_workers_tx,
%% timeout}'; if it had written to `Tx' already, `Tx' is cancelled first,
%% so that a caller who catches the error cannot commit half a call.
-module(couch_workers_tx).

-export([add/5, resubmit/5, update/3, finish/3, get/3, remove/3, cancel/3]).

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
    | {clear_range | add_read_conflict_range, binary(), binary()}.

%% An erlfdb error raised while performing a request: raised again at the
%% call's end.
-type failed() :: undefined | {error | throw | exit, term(), list()}.

%% What the serving loop keeps: the transaction, the call's reference and
%% resource, the next request's number, whether a write was performed,
%% and the first erlfdb error.
-record(serving, {
    tx :: {erlfdb_transaction, reference()},
    ref :: reference(),
    call :: reference(),
    seq = 0 :: non_neg_integer(),
    wrote = false :: boolean(),
    failed = undefined :: failed()
}).

%% The process dictionary's key of the session of the last transaction.
-define(SESSION, {?MODULE, session}).

%% How long a closed call has to send its end.
-define(CLOSE_WAIT_MS, 5000).

-spec add(tx(), binary(), binary(), map(), map()) -> ok | {error, term()}.
add(undefined, Type, Id, Info, Opts) ->
    couch_workers:job_add(Type, Id, Info, Opts);
add(Tx, Type, Id, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Info), is_map(Opts) ->
    FdbTx = fdb_tx(Tx),
    case couch_workers_jobs:add_opts(Opts) of
        {ok, NifOpts} ->
            run(FdbTx, fun(Ref, S) -> couch_workers_nif:budgeted(job_tx_add, [Ref, S, Type, Id, Info, NifOpts]) end);
        {error, _} = Error ->
            Error
    end;
add(_Tx, _Type, _Id, _Info, _Opts) ->
    erlang:error(badarg).

-spec resubmit(tx(), binary(), binary(), map(), map()) -> ok | {error, term()}.
resubmit(undefined, Type, Id, Info, Opts) ->
    couch_workers:job_resubmit(Type, Id, Info, Opts);
resubmit(Tx, Type, Id, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Info), is_map(Opts) ->
    FdbTx = fdb_tx(Tx),
    case couch_workers_jobs:resubmit_opts(Opts) of
        {ok, NifOpts, IfVs} ->
            run(FdbTx, fun(Ref, S) ->
                couch_workers_nif:budgeted(job_tx_resubmit, [Ref, S, Type, Id, Info, NifOpts, IfVs])
            end);
        {error, _} = Error ->
            Error
    end;
resubmit(_Tx, _Type, _Id, _Info, _Opts) ->
    erlang:error(badarg).

-spec update(tx(), map(), map()) -> {ok, map()} | {error, term()}.
update(undefined, Job, Info) ->
    couch_workers:job_update(Job, Info);
update(Tx, Job, Info) when is_map(Job), is_map(Info) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref, S) -> couch_workers_nif:budgeted(job_tx_update, [Ref, S, Job, Info]) end);
update(_Tx, _Job, _Info) ->
    erlang:error(badarg).

-spec finish(tx(), map(), map()) -> ok | {error, term()}.
finish(undefined, Job, Result) ->
    couch_workers:job_finish(Job, Result);
finish(Tx, Job, Result) when is_map(Job), is_map(Result) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref, S) -> couch_workers_nif:budgeted(job_tx_finish, [Ref, S, Job, Result]) end);
finish(_Tx, _Job, _Result) ->
    erlang:error(badarg).

-spec get(tx(), binary(), binary()) -> {ok, map()} | {error, term()}.
get(undefined, Type, Id) ->
    couch_workers:job_get(Type, Id);
get(Tx, Type, Id) when is_binary(Type), is_binary(Id) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref, S) -> couch_workers_nif:job_tx_get(Ref, S, Type, Id) end);
get(_Tx, _Type, _Id) ->
    erlang:error(badarg).

-spec remove(tx(), binary(), binary()) -> ok | {error, term()}.
remove(undefined, Type, Id) ->
    couch_workers:job_remove(Type, Id);
remove(Tx, Type, Id) when is_binary(Type), is_binary(Id) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref, S) -> couch_workers_nif:job_tx_remove(Ref, S, Type, Id, undefined) end);
remove(_Tx, _Type, _Id) ->
    erlang:error(badarg).

-spec cancel(tx(), binary(), binary()) -> ok | {error, term()}.
cancel(undefined, Type, Id) ->
    couch_workers:job_cancel(Type, Id);
cancel(Tx, Type, Id) when is_binary(Type), is_binary(Id) ->
    FdbTx = fdb_tx(Tx),
    run(FdbTx, fun(Ref, S) -> couch_workers_nif:job_tx_cancel(Ref, S, Type, Id) end);
cancel(_Tx, _Type, _Id) ->
    erlang:error(badarg).

%% The erlfdb transaction in `Tx': a wrong shape (a database, a pid, a
%% map without `tx') is `badarg'.
fdb_tx(#{tx := Tx}) -> fdb_tx(Tx);
fdb_tx({erlfdb_transaction, Ref} = Tx) when is_reference(Ref) -> Tx;
fdb_tx(_) -> erlang:error(badarg).

%% Starts the call with the session of `Tx''s attempt and serves its
%% requests until it ends; on FoundationDB, only once `Tx' is known to be
%% on the app's cluster. (On the embedded store the NIF refuses the call,
%% `fdb_only', before any request.)
run(Tx, Start) ->
    case app_cluster_file() of
        none ->
            start(Tx, Start, couch_workers_nif:job_tx_session(0));
        File ->
            case same_cluster(Tx, File) of
                true -> start(Tx, Start, session(Tx));
                false -> {error, wrong_cluster}
            end
    end.

start(Tx, Start, Session) ->
    Ref = make_ref(),
    case Start(Ref, Session) of
        {ok, Call} -> serve(#serving{tx = Tx, ref = Ref, call = Call});
        {error, _} = Error -> Error
    end.

%% The session of `Tx''s current attempt (the core's `store::overlay':
%% what the earlier calls of this attempt wrote with versionstamps, which
%% the later ones read back). One per process (only the process that made
%% an erlfdb transaction may use it), for the transaction and read version
%% of its last call: a retried attempt (erlfdb's `on_error' resets the
%% transaction) reads at a newer version and gets a fresh session. The
%% transaction is kept by its name, so that the process does not keep it
%% alive.
session({erlfdb_transaction, TxRef} = Tx) ->
    ReadVersion = erlfdb:wait(erlfdb:get_read_version(Tx)),
    Name = erlang:ref_to_list(TxRef),
    case get(?SESSION) of
        {Name, ReadVersion, Session} ->
            Session;
        _ ->
            Session = couch_workers_nif:job_tx_session(ReadVersion),
            put(?SESSION, {Name, ReadVersion, Session}),
            Session
    end.

%% Whether `Tx' is on the cluster of the app's store: FoundationDB's
%% connection string as `Tx' reads it (the special key, answered by the
%% client without a read of the cluster) against the app's cluster file.
same_cluster(Tx, File) ->
    Theirs = erlfdb:wait(erlfdb:get(Tx, <<"\xff\xff/connection_string">>)),
    case file:read_file(File) of
        {ok, Ours} -> connection_string(Ours) =:= connection_string(Theirs);
        {error, _} -> false
    end.

app_cluster_file() ->
    case application:get_env(couch_workers, store) of
        {ok, {fdb, File}} -> File;
        {ok, {fdb_test, File, _}} -> File;
        {ok, {fdb_test, File, _, shared}} -> File;
        _ -> none
    end.

%% A cluster file's connection string: its first line that is not a
%% comment, without surrounding blanks.
connection_string(Bin) when is_binary(Bin) ->
    Lines = [string:trim(L) || L <- binary:split(Bin, [<<"\n">>, <<"\r">>], [global])],
    case [L || L <- Lines, L =/= <<>>, binary:first(L) =/= $#] of
        [Conn | _] -> Conn;
        [] -> <<>>
    end;
connection_string(_) ->
    <<>>.

-spec serve(#serving{}) -> term().
serve(#serving{ref = Ref, seq = Seq, failed = Failed} = S) ->
    receive
        {Ref, Seq, {done, Result}} ->
            case Failed of
                undefined -> Result;
                {Class, Reason, Stack} -> erlang:raise(Class, Reason, Stack)
            end;
        {Ref, Seq, Request} ->
            serve(perform(S, Request))
    after couch_workers_app:call_timeout() ->
        timed_out(S)
    end.

%% The core sent nothing for the call timeout: the call is closed (its
%% waiting read fails, and it ends), its last messages are dropped, and
%% a `Tx' it wrote to is cancelled (half a call must never commit).
-spec timed_out(#serving{}) -> no_return().
timed_out(#serving{tx = Tx, ref = Ref, call = Call, wrote = Wrote}) ->
    ok = couch_workers_nif:job_tx_close(Call),
    drain(Ref, erlang:monotonic_time(millisecond) + ?CLOSE_WAIT_MS),
    case Wrote of
        true -> erlfdb:cancel(Tx);
        false -> ok
    end,
    erlang:error({couch_workers_tx, timeout}).

drain(Ref, Deadline) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {Ref, _, {done, _}} -> ok;
        {Ref, _, _} -> drain(Ref, Deadline)
    after Left -> ok
    end.

-spec perform(#serving{}, request()) -> #serving{}.
perform(#serving{tx = Tx, call = Call, seq = Seq, failed = Failed} = S, Request) ->
    Next = S#serving{seq = Seq + 1, wrote = S#serving.wrote orelse not is_read(Request)},
    try do(Tx, Request) of
        no_answer ->
            Next;
        Answer ->
            answer(Call, Seq, Answer),
            Next
    catch
        error:{erlfdb_error, Code} = Reason:Stack ->
            case is_read(Request) of
                true -> answer(Call, Seq, {error, Code});
                false -> ok
            end,
            Next#serving{failed = first(Failed, {error, Reason, Stack})};
        Class:Reason:Stack ->
            %% Not an erlfdb error (`Tx' is no transaction of erlfdb's, or
            %% erlfdb is not loaded): the call is closed and ended before
            %% the error goes on.
            ok = couch_workers_nif:job_tx_close(Call),
            drain(S#serving.ref, erlang:monotonic_time(millisecond) + ?CLOSE_WAIT_MS),
            erlang:raise(Class, Reason, Stack)
    end.

answer(Call, Seq, Answer) ->
    % false: the call ended meanwhile (its owner closed it); nothing waits.
    _ = couch_workers_nif:budgeted(job_tx_answer, [Call, Seq, Answer]),
    ok.

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
    written(erlfdb:add_read_conflict_key(Tx, Key));
do(Tx, {add_read_conflict_range, Begin, End}) ->
    written(erlfdb:add_read_conflict_range(Tx, Begin, End)).

written(_) -> no_answer.
