%% @doc A couch_workers node of the FoundationDB fault harness
%% (scripts/fdb-faults.sh; the controller is `cw_faults'): its own `erl'
%% OS process on the store `{fdb, ClusterFile}', running
%%
%% * `workers' workers (health timeout `timeout' s) that accept jobs of
%%   the type <<"faults">>, work 10-40 ms, and finish them;
%% * a producer that adds one job every `add_ms' ms until the file
%%   `stop_adds' appears (and, with `subscribe', subscribes to each job it
%%   added and waits for its `finished' delivery);
%% * a membership subscription of the type;
%% * a `logger' handler that writes every report of the Rust side that has
%%   a `what' (worker_reaped, worker_reinstated, watch_limit_reached, ...).
%%
%% Everything it sees goes to append-only files in the run's directory,
%% one line per fact, written right after the call answered, with the
%% wall clock in ms (the controller compares them across processes):
%%
%%   nI.adds     `try Id' before a job_add, `add Id Answer Ms' after
%%   nI.fins     `fin Id FinId Answer Attempts' per job_finish call (the
%%               result stored is #{fin => FinId}: which call stuck)
%%   nI.events   `Ms event What Id', `Ms reaped_msg Id' (the owner got
%%               {couch_workers_worker_reaped, Ref}), `Ms lost_msg Id R',
%%               `Ms membership Id,Id,...', `Ms sub Id State',
%%               `Ms accept_error Id Reason', `Ms started' ...
%%
%% A `kill -9' can cut a line off: the reader skips torn lines.
-module(cw_faults_node).

-export([node_main/1]).
%% logger handler callback
-export([log/2]).

-spec node_main([{atom(), term()}]) -> no_return().
-spec log(logger:log_event(), logger:handler_config()) -> ok.

-define(TYPE, <<"faults">>).

node_main(CfgList) ->
    Cfg = maps:from_list(CfgList),
    #{dir := Dir, name := Name, workers := W, cluster_file := CF} = Cfg,
    process_flag(trap_exit, true),
    Events = file_name(Dir, Name, "events"),
    ev(Events, "booting ~s", [os:getpid()]),
    ok = application:load(couch_workers),
    logger:set_primary_config(level, notice),
    ok = logger:set_handler_config(default, level, warning),
    ok = logger:add_handler(cw_faults_events, ?MODULE, #{level => notice, config => #{file => Events}}),
    ok = application:set_env(couch_workers, store, {fdb, CF}),
    T0 = now_ms(),
    case application:ensure_all_started(couch_workers) of
        {ok, _} ->
            ev(Events, "app_started ~b", [now_ms() - T0]);
        Error ->
            ev(Events, "app_start_failed ~b ~0p", [now_ms() - T0, Error]),
            io:format("~s: couch_workers did not start after ~b ms: ~p~n", [Name, now_ms() - T0, Error]),
            halt(4)
    end,
    Self = self(),
    Members = spawn_link(fun() -> members(Events) end),
    Workers = [spawn_link(fun() -> worker(Cfg, Events, Slot, Self) end) || Slot <- lists:seq(1, W)],
    %% Every worker registered (each says so) before the node counts as up.
    [receive {registered, P} -> ok end || P <- Workers],
    Producer = spawn_link(fun() -> producer(Cfg, Self, 1) end),
    ok = file:write_file(filename:join(Dir, Name ++ ".pid"), os:getpid()),
    ev(Events, "started ~b", [now_ms() - T0]),
    io:format("~s: up (OS pid ~s), ~b workers~n", [Name, os:getpid(), W]),
    wait_stop(Cfg, Events, [Producer, Members | Workers], Workers).

wait_stop(#{dir := Dir} = Cfg, Events, All, Workers) ->
    case filelib:is_file(filename:join(Dir, "stop")) of
        true ->
            [P ! stop || P <- Workers],
            [
                begin
                    M = erlang:monitor(process, P),
                    receive
                        {'DOWN', M, process, P, _} -> ok
                    after 20000 -> ok
                    end
                end
             || P <- Workers
            ],
            ev(Events, "stopping", []),
            application:stop(couch_workers),
            halt(0);
        false ->
            receive
                {'EXIT', Pid, Reason} when Reason =/= normal ->
                    ev(Events, "crash ~0p ~0p", [Pid, Reason]),
                    io:format("process ~p crashed: ~p~n", [Pid, Reason]),
                    halt(3)
            after 200 ->
                wait_stop(Cfg, Events, All, Workers)
            end
    end.

%% ---- the producer ------------------------------------------------------------

producer(#{dir := Dir, name := Name, add_ms := AddMs} = Cfg, Parent, N) ->
    case filelib:is_file(filename:join(Dir, "stop_adds")) of
        true ->
            ev(file_name(Dir, Name, "events"), "adds_stopped ~b", [N - 1]),
            unlink(Parent),
            wait_subs(Cfg);
        false ->
            Id = iolist_to_binary(io_lib:format("~s-~6..0b", [Name, N])),
            Adds = file_name(Dir, Name, "adds"),
            append(Adds, ["try ", Id, "\n"]),
            T0 = now_ms(),
            Answer =
                try couch_workers:job_add(?TYPE, Id, #{<<"n">> => N}, #{}) of
                    ok -> <<"ok">>;
                    {error, R} -> iolist_to_binary(io_lib:format("error:~0p", [R]));
                    Other -> iolist_to_binary(io_lib:format("other:~0p", [Other]))
                catch
                    C:E -> iolist_to_binary(io_lib:format("raise:~0p:~0p", [C, E]))
                end,
            append(Adds, ["add ", Id, " ", Answer, " ", integer_to_binary(now_ms() - T0), "\n"]),
            case {Answer, maps:get(subscribe, Cfg, false)} of
                {<<"ok">>, true} -> subscribe(Cfg, Id);
                _ -> ok
            end,
            timer:sleep(AddMs),
            producer(Cfg, Parent, N + 1)
    end.

%% Subscribes to a job just added; a process per job waits for its
%% `finished' delivery, logs it, and unsubscribes.
subscribe(#{dir := Dir, name := Name}, Id) ->
    Events = file_name(Dir, Name, "events"),
    P = spawn(fun() ->
        receive go -> ok end,
        R = (catch couch_workers:job_subscribe(?TYPE, Id, self())),
        case R of
            {ok, Ref, #{state := S}} ->
                ev(Events, "sub ~s ~s", [Id, S]),
                sub_wait(Events, Id, Ref, S);
            Err ->
                ev(Events, "sub_error ~s ~0p", [Id, Err])
        end,
        ok
    end),
    P ! go,
    ok.

sub_wait(_Events, _Id, Ref, finished) ->
    couch_workers:job_unsubscribe(Ref);
sub_wait(Events, Id, Ref, _) ->
    receive
        {couch_workers_job, Ref, removed} ->
            ev(Events, "sub ~s removed", [Id]);
        {couch_workers_job, Ref, #{state := S}} ->
            ev(Events, "sub ~s ~s", [Id, S]),
            sub_wait(Events, Id, Ref, S)
    end.

%% After the adds stopped: the subscribers stay until the stop (the
%% controller reads which of them saw `finished').
wait_subs(_Cfg) ->
    receive
        never -> ok
    end.

%% ---- membership ---------------------------------------------------------------

members(Events) ->
    Ref = couch_workers:membership_subscribe(?TYPE, nil, self()),
    true = is_reference(Ref),
    members_loop(Events, Ref).

members_loop(Events, Ref) ->
    receive
        {couch_workers_membership, ?TYPE, Workers, _VS, Ref} ->
            Ids = lists:join(",", lists:sort(maps:keys(Workers))),
            ev(Events, "membership ~s", [iolist_to_binary(Ids)]),
            members_loop(Events, Ref);
        {couch_workers_membership_ended, Ref, Reason} ->
            ev(Events, "membership_ended ~0p", [Reason]),
            members(Events)
    end.

%% ---- workers ---------------------------------------------------------------------

worker(#{name := Name, timeout := Timeout} = Cfg, Events, Slot, Parent) ->
    Id = iolist_to_binary(io_lib:format("~s-w~b", [Name, Slot])),
    Ref = couch_workers:worker_register(?TYPE, Id, #{timeout => Timeout}, self()),
    true = is_reference(Ref),
    Parent ! {registered, self()},
    work(Cfg, Events, Id, Ref, 0).

work(Cfg, Events, Id, Ref, K) ->
    receive
        stop ->
            couch_workers:worker_unregister(Ref);
        {couch_workers_worker_reaped, Ref} ->
            ev(Events, "reaped_msg ~s", [Id]),
            work(Cfg, Events, Id, Ref, K);
        {couch_workers_worker_lost, Ref, Reason} ->
            ev(Events, "lost_msg ~s ~0p", [Id, Reason]),
            Ref2 = couch_workers:worker_register(?TYPE, Id, #{timeout => maps:get(timeout, Cfg)}, self()),
            work(Cfg, Events, Id, Ref2, K)
    after 0 ->
        case catch couch_workers:job_accept(Ref, #{timeout => 500}) of
            {ok, H} ->
                timer:sleep(10 + rand:uniform(30)),
                K1 = finish(Cfg, Id, H, K, 0),
                work(Cfg, Events, Id, Ref, K1);
            {error, not_found} ->
                work(Cfg, Events, Id, Ref, K);
            Other ->
                ev(Events, "accept_error ~s ~0p", [Id, Other]),
                timer:sleep(100),
                work(Cfg, Events, Id, Ref, K)
        end
    end.

%% One job_finish call per try, each with its own FinId in the result, so
%% the stored result names the call that stuck. A call that answered an
%% error other than not_owner/not_found is tried again (200 ms apart, for
%% up to about a minute: a stalled cluster), as a worker would.
finish(#{dir := Dir, name := Name} = Cfg, Id, #{id := JobId, attempts := A} = H, K, Tries) ->
    FinId = iolist_to_binary(io_lib:format("~s.~b", [Id, K])),
    Answer =
        case catch couch_workers:job_finish(H, #{<<"fin">> => FinId}) of
            ok -> <<"ok">>;
            {error, R} -> iolist_to_binary(io_lib:format("error:~0p", [R]));
            Other -> iolist_to_binary(io_lib:format("other:~0p", [Other]))
        end,
    append(file_name(Dir, Name, "fins"), [
        "fin ", JobId, " ", FinId, " ", Answer, " ", integer_to_binary(A), "\n"
    ]),
    case Answer of
        <<"ok">> -> K + 1;
        <<"error:not_owner">> -> K + 1;
        <<"error:not_found">> -> K + 1;
        _ when Tries < 300 ->
            timer:sleep(200),
            finish(Cfg, Id, H, K + 1, Tries + 1);
        _ ->
            K + 1
    end.

%% ---- logger handler: the Rust side's reports ----------------------------------

log(#{msg := {report, #{what := What} = R}}, #{config := #{file := File}}) ->
    Id =
        case R of
            #{id := I} when is_binary(I) -> I;
            _ -> <<"-">>
        end,
    Extra =
        case R of
            #{reason := Why} -> io_lib:format(" ~0p", [Why]);
            _ -> ""
        end,
    ev(File, "event ~s ~s~s", [What, Id, Extra]);
log(_, _) ->
    ok.

%% ---- helpers -------------------------------------------------------------------

file_name(Dir, Name, Kind) ->
    filename:join(Dir, Name ++ "." ++ Kind).

ev(File, Fmt, Args) ->
    append(File, [integer_to_binary(os:system_time(millisecond)), " ", io_lib:format(Fmt, Args), "\n"]).

append(File, IoData) ->
    ok = file:write_file(File, IoData, [append, raw]).

now_ms() ->
    erlang:monotonic_time(millisecond).
