%% @doc Helpers shared by the EUnit suites (not a suite itself).
-module(couch_workers_test_util).

-include_lib("eunit/include/eunit.hrl").

-export([
    app_fixture/4,
    test_store/3,
    fdb_notice/2,
    start_app/0,
    start_app/1,
    stop_app/1,
    tmp_dir/0,
    unique_type/1,
    wait_for/2,
    wait_for/3,
    wait_restarted/2,
    recv_membership/2,
    wait_membership/3,
    no_membership/2,
    set_sink/2,
    clear_sink/1,
    recv_callback/2,
    gc_servers/0,
    settled_stats/1,
    register_worker/2,
    register_worker/3,
    recv_job/2,
    wait_job/3,
    no_job_msg/2,
    job_state/2
]).

%% Peers, leaks, figures (the reliability suites).
-export([
    peer_fixture/3,
    start_peer/1,
    start_peer/2,
    peer_start_app/2,
    kill_peer/1,
    stop_peer/1,
    os_pid_alive/1,
    counts/0,
    env_int/2
]).

%% ---- app lifecycle -------------------------------------------------------

%% Starts couch_workers on a fresh store directory; returns the context
%% that stop_app/1 takes.
%% The fixture of most suites: the app started once on a fresh store
%% directory (start_app/0, stop_app/1), and `Setup'/`Teardown' around each
%% of `Tests' (EUnit's `foreach').
-spec app_fixture(string(), fun(() -> term()), fun((term()) -> term()), list()) -> tuple().
app_fixture(Title, Setup, Teardown, Tests) ->
    {Title, {setup, fun start_app/0, fun stop_app/1, {foreach, Setup, Teardown, Tests}}}.

start_app() ->
    start_app(#{}).

start_app(Env) ->
    Dir = tmp_dir(),
    case application:load(couch_workers) of
        ok -> ok;
        {error, {already_loaded, couch_workers}} -> ok
    end,
    %% Quiet tests: warnings and worse only (a test that checks logging
    %% raises the level itself).
    logger:set_primary_config(level, warning),
    FdbClusterFile = os:getenv("FDB_CLUSTER_FILE"),
    notice_once(FdbClusterFile),
    Store = test_store(FdbClusterFile, Dir, filename:basename(Dir)),
    %% On FoundationDB the app joins its test directory as `shared', so
    %% that a restart of its node within the app (the node-owner suites)
    %% keeps the data, as the embedded store's directory does; stop_app/1
    %% removes the directory.
    ok = application:set_env(couch_workers, store, joined(Store)),
    maps:foreach(fun(K, V) -> ok = application:set_env(couch_workers, K, V) end, Env),
    {ok, _} = application:ensure_all_started(couch_workers),
    #{dir => Dir, store => Store}.

joined({fdb_test, File, Name}) -> {fdb_test, File, Name, shared};
joined(Store) -> Store.

%% The store an app start of the suites runs on: FoundationDB when
%% FDB_CLUSTER_FILE is set (the NIF then built with the `fdb' feature by
%% the compile hook), under its own directory ["couch_workers_test", Name]
%% that stop_app/1 removes, so that runs never meet;
%% the embedded store under Dir otherwise. Suites that pass their own
%% `store' (or start peers on a shared directory) stay on it.
-spec test_store(string() | false, string(), string()) ->
    {embedded, string()} | {fdb_test, string(), string()}.
test_store(false, Dir, _Name) -> {embedded, Dir};
test_store("", Dir, _Name) -> {embedded, Dir};
test_store(ClusterFile, _Dir, Name) -> {fdb_test, ClusterFile, Name}.

%% A peer's store: the one this node's start_app/1 opened for `Dir' (on
%% FoundationDB, the same test directory, joined and left in place: the
%% node that made it removes it when its app stops).
-spec peer_store(string() | false, string()) ->
    {embedded, string()} | {fdb_test, string(), string(), shared}.
peer_store(ClusterFile, Dir) ->
    joined(test_store(ClusterFile, Dir, filename:basename(Dir))).

%% The line that says which store the suites run on: loud when the
%% FoundationDB run is skipped. Written to Io.
-spec fdb_notice(string() | false, io:device()) -> ok.
fdb_notice(ClusterFile, Io) when ClusterFile =:= false; ClusterFile =:= "" ->
    io:format(Io, "~n*** couch_workers EUnit: FDB_CLUSTER_FILE is not set: the FoundationDB run is SKIPPED; "
        "the suites run on the embedded store (docs/fdb.md, \"EUnit against FoundationDB\") ***~n", []);
fdb_notice(ClusterFile, Io) ->
    io:format(Io, "~n*** couch_workers EUnit: running against FoundationDB (FDB_CLUSTER_FILE=~ts), "
        "each app start under its own directory couch_workers_test/<name> ***~n", [ClusterFile]).

%% Once per VM: on the console, past EUnit's capture of test output.
notice_once(ClusterFile) ->
    case persistent_term:get({?MODULE, fdb_notice}, false) of
        true ->
            ok;
        false ->
            persistent_term:put({?MODULE, fdb_notice}, true),
            fdb_notice(ClusterFile, user)
    end.

stop_app(#{dir := Dir} = Fixture) ->
    ok = application:stop(couch_workers),
    remove_test_directory(maps:get(store, Fixture, undefined)),
    _ = file:del_dir_r(Dir),
    ok.

%% The FoundationDB test directory's owner removes it when its node
%% closes: a node started and stopped on it as its owner.
remove_test_directory({fdb_test, _, _} = Owner) ->
    ok = application:set_env(couch_workers, store, Owner),
    {ok, _} = application:ensure_all_started(couch_workers),
    ok = application:stop(couch_workers);
remove_test_directory(_) ->
    ok.

tmp_dir() ->
    Dir = filename:join(
        "/tmp",
        "cw_eunit_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))
    ),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Dir.

unique_type(Prefix) ->
    iolist_to_binary([Prefix, "_", integer_to_list(erlang:unique_integer([positive]))]).

%% ---- waiting -------------------------------------------------------------

%% Polls Fun until it returns true (or a value other than false); fails
%% the test after Timeout ms.
wait_for(Fun, Timeout) ->
    wait_for(Fun, Timeout, 20).

wait_for(Fun, Timeout, Interval) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    wait_loop(Fun, Deadline, Interval).

%% The new pid registered as Name once a supervisor restarted the
%% process that was Old (the restart may take a backoff's time).
wait_restarted(Name, Old) ->
    wait_for(
        fun() ->
            case whereis(Name) of
                Pid when is_pid(Pid), Pid =/= Old -> Pid;
                _ -> false
            end
        end,
        20000
    ).

wait_loop(Fun, Deadline, Interval) ->
    case Fun() of
        false ->
            case erlang:monotonic_time(millisecond) >= Deadline of
                true -> erlang:error({wait_for_timeout, Fun});
                false ->
                    timer:sleep(Interval),
                    wait_loop(Fun, Deadline, Interval)
            end;
        true ->
            ok;
        Value ->
            Value
    end.

%% The next nil-subscription delivery for Ref: {VS, Workers} or timeout.
recv_membership(Ref, Timeout) ->
    receive
        {couch_workers_membership, _Type, Workers, VS, Ref} -> {VS, Workers}
    after Timeout -> timeout
    end.

%% Receives deliveries for Ref until Pred(Workers) holds; checks that the
%% versionstamps strictly increase. Returns {VS, Workers, AllVSs}.
wait_membership(Ref, Pred, Timeout) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    wait_membership(Ref, Pred, Deadline, []).

wait_membership(Ref, Pred, Deadline, Seen) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    case recv_membership(Ref, Left) of
        timeout ->
            erlang:error({membership_timeout, lists:reverse(Seen)});
        {VS, Workers} ->
            case Seen of
                [Prev | _] -> ?assert(VS > Prev);
                [] -> ok
            end,
            case Pred(Workers) of
                true -> {VS, Workers, lists:reverse([VS | Seen])};
                false -> wait_membership(Ref, Pred, Deadline, [VS | Seen])
            end
    end.

%% Asserts that no delivery for Ref arrives within Timeout ms.
no_membership(Ref, Timeout) ->
    ?assertEqual(timeout, recv_membership(Ref, Timeout)).

%% ---- callback modules ----------------------------------------------------

%% The callback modules (couch_workers_test_cb and friends) forward each
%% call for Type to the pid set here, as {cb, Module, Type, Workers, VS, Ref}.
set_sink(Type, Pid) ->
    persistent_term:put({couch_workers_test_sink, Type}, Pid).

clear_sink(Type) ->
    _ = persistent_term:erase({couch_workers_test_sink, Type}),
    ok.

recv_callback(Module, Timeout) ->
    receive
        {cb, Module, Type, Workers, VS, Ref} -> {Type, Workers, VS, Ref}
    after Timeout -> timeout
    end.

%% ---- leaks ---------------------------------------------------------------

%% Garbage collects the servers (and this process) so that dropped NIF
%% resources are freed.
gc_servers() ->
    [
        erlang:garbage_collect(P)
     || Name <- [couch_workers_local, couch_workers_global, couch_workers_jobs_subs], P <- [whereis(Name)], is_pid(P)
    ],
    erlang:garbage_collect(),
    ok.

%% Waits until the stats match Expected (a sub-map), GC-ing the servers
%% while waiting; returns the stats.
settled_stats(Expected) ->
    wait_for(
        fun() ->
            gc_servers(),
            S = couch_workers:stats(),
            case maps:with(maps:keys(Expected), S) =:= Expected of
                true -> S;
                false -> false
            end
        end,
        5000
    ).

%% ---- jobs ------------------------------------------------------------------

%% Registers worker Id of Type for the calling process; returns its Ref.
register_worker(Type, Id) ->
    register_worker(Type, Id, #{}).

register_worker(Type, Id, Opts) ->
    Ref = couch_workers:worker_register(Type, Id, Opts, self()),
    ?assert(is_reference(Ref)),
    Ref.

%% The next job message for subscription Ref: a job map, `removed', or
%% `timeout'.
recv_job(Ref, Timeout) ->
    receive
        {couch_workers_job, Ref, Msg} -> Msg
    after Timeout -> timeout
    end.

%% Receives job messages for Ref until Pred(Job) holds; checks that their
%% versionstamps strictly increase. Returns the job.
wait_job(Ref, Pred, Timeout) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    wait_job(Ref, Pred, Deadline, undefined).

wait_job(Ref, Pred, Deadline, LastVS) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    case recv_job(Ref, Left) of
        timeout ->
            erlang:error({job_message_timeout, Ref});
        removed ->
            case Pred(removed) of
                true -> removed;
                false -> erlang:error({job_removed, Ref})
            end;
        #{vs := VS} = Job ->
            case LastVS of
                undefined -> ok;
                _ -> ?assert(VS > LastVS)
            end,
            case Pred(Job) of
                true -> Job;
                false -> wait_job(Ref, Pred, Deadline, VS)
            end
    end.

%% Asserts that no job message for Ref arrives within Timeout ms.
no_job_msg(Ref, Timeout) ->
    ?assertEqual(timeout, recv_job(Ref, Timeout)).

%% The state of a job, or not_found.
job_state(Type, Id) ->
    case couch_workers:job_get(Type, Id) of
        {ok, #{state := State}} -> State;
        {error, not_found} -> not_found
    end.

%% ---- peers -------------------------------------------------------------------

%% The fixture of the multi-node suites: couch_workers runs here on a
%% fresh store for the whole suite; each test gets a fresh peer node on the
%% same store (stopped after it) and a fresh worker/job type, as
%% `#{peer, os_pid, dir, type}'. `Tests': ?TDEF_FE entries.
peer_fixture(Title, TypePrefix, Tests) ->
    {
        Title,
        {
            setup,
            fun start_app/0,
            fun stop_app/1,
            fun(#{dir := Dir}) ->
                {
                    foreach,
                    fun() -> (start_peer(Dir))#{dir => Dir, type => unique_type(TypePrefix)} end,
                    fun stop_peer/1,
                    Tests
                }
            end
        }
    }.

%% Starts a peer node: a separate OS process (`erl`, OTP's `peer` over its
%% standard I/O, so no distribution, epmd or cookie), with this VM's own
%% code path (the app and the tests, not OTP's), running couch_workers on
%% the store directory `Dir' (shared with this node). `Env': more
%% application env of couch_workers on the peer. Returns
%% `#{peer := Pid, os_pid := OsPidString}'.
start_peer(Dir) ->
    start_peer(Dir, #{}).

start_peer(Dir, Env) ->
    Erl = os:find_executable("erl"),
    OtpLib = code:lib_dir(),
    Paths = [P || P <- code:get_path(), not lists:prefix(OtpLib, P), P =/= "."],
    %% (No -noinput: standard_io is the peer's control channel.)
    Args = lists:append([["-pa", P] || P <- Paths]),
    {ok, Peer, _Node} = peer:start(#{
        exec => Erl,
        connection => standard_io,
        args => Args,
        wait_boot => 30000
    }),
    ok = peer:call(Peer, ?MODULE, peer_start_app, [Dir, Env], 30000),
    OsPid = peer:call(Peer, os, getpid, [], 15000),
    #{peer => Peer, os_pid => OsPid}.

%% Run on the peer: starts couch_workers on Dir.
peer_start_app(Dir, Env) ->
    case application:load(couch_workers) of
        ok -> ok;
        {error, {already_loaded, couch_workers}} -> ok
    end,
    logger:set_primary_config(level, warning),
    ok = application:set_env(couch_workers, store, peer_store(os:getenv("FDB_CLUSTER_FILE"), Dir)),
    maps:foreach(fun(K, V) -> ok = application:set_env(couch_workers, K, V) end, Env),
    {ok, _} = application:ensure_all_started(couch_workers),
    ok.

%% kill -9 of the peer's OS process; returns once the process is gone.
kill_peer(#{os_pid := OsPid}) ->
    _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"),
    wait_for(fun() -> not os_pid_alive(OsPid) end, 5000, 5).

%% Stops the peer however it is (never leaves an OS process behind).
stop_peer(#{peer := Peer, os_pid := OsPid}) ->
    case is_process_alive(Peer) of
        true -> catch peer:stop(Peer);
        false -> ok
    end,
    _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"),
    ok.

%% Whether the OS process exists (and is not a zombie).
os_pid_alive(OsPid) ->
    case file:read_file("/proc/" ++ OsPid ++ "/stat") of
        {ok, Stat} ->
            %% "pid (comm) S ...": the state follows the last ')'.
            [_, Rest] = string:split(Stat, ")", trailing),
            string:trim(Rest, leading) =/= <<>> andalso binary:first(string:trim(Rest, leading)) =/= $Z;
        {error, _} ->
            false
    end.

%% ---- figures -------------------------------------------------------------------

%% The counts of couch_workers:stats() that must return to their start
%% (live tasks and NIF handles), after GC-ing the servers.
counts() ->
    gc_servers(),
    maps:with(
        [
            heartbeats,
            watchers,
            reapers,
            registrations,
            watches,
            job_dispatchers,
            job_waiters,
            job_watchers,
            job_sweepers,
            job_subscriptions,
            accept_waiters
        ],
        couch_workers:stats()
    ).

%% An integer from the OS environment, or Default.
env_int(Name, Default) ->
    case os:getenv(Name) of
        false ->
            Default;
        "" ->
            Default;
        V ->
            try
                list_to_integer(string:trim(V))
            catch
                error:badarg -> erlang:error({bad_env, Name, V})
            end
    end.
