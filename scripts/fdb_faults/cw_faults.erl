%% @doc The controller of the FoundationDB fault harness
%% (scripts/fdb-faults.sh runs one controller VM per fault).
%%
%% For one fault it starts a real local cluster (scripts/fdb-cluster.sh),
%% two couch_workers nodes (`cw_faults_node', each its own `erl' OS
%% process on `{fdb, ClusterFile}', 3 workers with a 4 s timeout, a
%% producer adding a job every 50 ms), lets them run, injects the fault,
%% waits until fdbcli says the database is available again, lets things
%% settle, stops the adds, drains (this VM then starts couch_workers on
%% the same cluster and waits until every job that exists is finished),
%% stops the nodes and counts from their logs and the store:
%%
%% * lost: jobs whose add answered `ok', or that exist, and are not
%%   finished in the end (plus those answered `ok' that do not exist);
%% * twice: jobs for which more than one `job_finish' answered `ok', or
%%   for which an `ok' came from a call whose result is not the stored one;
%% * live_reaped: `{couch_workers_worker_reaped, Ref}' messages to owners,
%%   `worker_reinstated' and `worker_superseded' events, and
%%   `worker_reaped' events of workers whose node was not killed;
%% * wrong_answers: an add answered `ok' whose job does not exist; an add
%%   answered an error that exists (`commit_unknown_result' excepted: the
%%   documented "may have happened"); a finish answered an error whose
%%   result is the stored one (same exception); a finish answered `ok'
%%   for a job that is not finished;
%% * dead_node_left_ms (a killed node only): from the kill to the first
%%   membership delivery on the surviving node without any of the killed
%%   node's workers.
%%
%% Fault 6 also counts subscriptions that never saw their job's
%% `finished' (sub_missed) and fails on them.
-module(cw_faults).

-export([main/1]).

-spec main(map()) -> no_return().

-define(TYPE, <<"faults">>).

-define(FAULTS, [
    {1, kill9, 1},
    {2, sigstop, 1},
    {3, recovery, 3},
    {4, exclude, 3},
    {5, start_down, 1},
    {6, watch_limit, 1},
    {7, node_kill, 1},
    %% A control, not one of the faults: it must fail (live_reaped > 0).
    {8, node_stop_control, 1}
]).

main(Opts0) ->
    Opts = maps:merge(
        #{
            timeout => 4,
            workers => 3,
            add_ms => 50,
            warm_ms => 3000,
            drain_s => 30,
            watch_limit => 5,
            fdb_cli => os:getenv("FDB_CLI", "fdbcli")
        },
        Opts0
    ),
    #{fault := F, dir := Dir0} = Opts,
    {Num, Name, Procs} = lists:keyfind(F, 1, ?FAULTS),
    Dir = filename:absname(Dir0),
    _ = file:del_dir_r(Dir),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    logger:set_primary_config(level, error),
    T0 = now_ms(),
    out("fault ~b (~s): cluster of ~b process(es), run directory ~s", [Num, Name, Procs, Dir]),
    {CF, CDir} = cluster_start(Opts, Procs),
    Ctx = #{opts => Opts#{dir => Dir}, dir => Dir, cf => CF, cdir => CDir, procs => Procs, t0 => T0, name => Name},
    Result =
        try
            fault(Name, Ctx)
        catch
            C:E:St ->
                out("fault ~b (~s): harness error ~p:~p~n~p", [Num, Name, C, E, St]),
                #{harness_error => {C, E}}
        after
            kill_nodes(Dir),
            cluster_stop(Opts, CDir)
        end,
    Line = summary(Num, Name, Result, now_ms() - T0),
    out("~s", [Line]),
    ok = file:write_file(filename:join(Dir, "summary"), [Line, "\n"]),
    halt(
        case failed(Result) of
            false -> 0;
            true -> 1
        end
    ).

failed(#{harness_error := _}) ->
    true;
failed(#{lost := L, twice := T, live_reaped := R, wrong_answers := W} = Res) ->
    L + T + R + W + maps:get(sub_missed, Res, 0) > 0 orelse maps:get(node_failed, Res, false) =/= false.

summary(Num, Name, #{harness_error := E}, Ms) ->
    io_lib:format("fault ~b ~s: HARNESS ERROR ~0p (~.1f s)", [Num, Name, E, Ms / 1000]);
summary(Num, Name, Res, Ms) ->
    #{lost := L, twice := T, live_reaped := R, wrong_answers := W} = Res,
    Left =
        case maps:get(dead_node_left_ms, Res, undefined) of
            undefined -> "-";
            X -> io_lib:format("~p", [X])
        end,
    Extra = maps:without([lost, twice, live_reaped, wrong_answers, dead_node_left_ms], Res),
    io_lib:format(
        "fault ~b ~s: lost=~b twice=~b live_reaped=~b wrong_answers=~b dead_node_left_ms=~s (~.1f s) ~s",
        [Num, Name, L, T, R, W, Left, Ms / 1000, format_extra(Extra)]
    ).

format_extra(M) ->
    lists:join(" ", [io_lib:format("~s=~0p", [K, V]) || {K, V} <- lists:sort(maps:to_list(M))]).

%% ---- the faults ------------------------------------------------------------------

fault(kill9, Ctx) ->
    run(Ctx, #{}, fun(C) ->
        V1 = version(C),
        Kill = wall(),
        cluster_cmd(C, "kill", [0, "KILL"]),
        out("  ~s: fdbserver 0 killed with -9; restarting it in 5 s", [ts(C)]),
        timer:sleep(5000),
        cluster_cmd(C, "restart", [0]),
        Avail = wait_available(C, 60000),
        out("  ~s: restarted; available ~b ms after the restart", [ts(C), Avail]),
        #{down_ms => wall() - Kill, available_after_restart_ms => Avail, version_jump_s => jump(C, V1, Kill)}
    end);
fault(sigstop, #{opts := #{timeout := T}} = Ctx) ->
    run(Ctx, #{}, fun(C) ->
        Stops = [
            begin
                V1 = version(C),
                S = wall(),
                cluster_cmd(C, "kill", [0, "STOP"]),
                out("  ~s: fdbserver 0 stopped (SIGSTOP) for ~b s (~bx the timeout)", [ts(C), Mult * T, Mult]),
                timer:sleep(Mult * T * 1000),
                cluster_cmd(C, "kill", [0, "CONT"]),
                Avail = wait_available(C, 60000),
                out("  ~s: SIGCONT; available after ~b ms", [ts(C), Avail]),
                J = jump(C, V1, S),
                timer:sleep((T + 1) * 1000),
                {Mult, J}
            end
         || Mult <- [2, 3]
        ],
        #{stops => [M || {M, _} <- Stops], version_jump_s => [J || {_, J} <- Stops]}
    end);
fault(recovery, Ctx) ->
    %% Two recoveries: the master's process killed (the one holding the
    %% cluster controller too, if one holds both), restarted; then the
    %% cluster controller's process, if that is another one.
    run(Ctx, #{}, fun(C) ->
        First = recover(C, cc_process(C), "the master"),
        timer:sleep(3000),
        R = roles(C),
        [CC | _] = [I || {I, Rs} <- R, lists:member("cluster_controller", Rs)],
        Second =
            case lists:member("master", proplists:get_value(CC, R)) of
                true -> [];
                false -> [recover(C, CC, "the cluster controller")]
            end,
        Rs = [First | Second],
        #{
            killed_process => [I || {I, _, _} <- Rs],
            available_after_kill_ms => [A || {_, A, _} <- Rs],
            version_jump_s => [J || {_, _, J} <- Rs]
        }
    end);
fault(exclude, Ctx) ->
    run(Ctx, #{}, fun(C) ->
        I = exclude_process(C),
        Addr = "127.0.0.1:" ++ port(C, I),
        V1 = version(C),
        S = wall(),
        %% no_wait: the data movement goes on while the run does (waiting
        %% for it took 35 s on a 3-process memory cluster).
        Ex = cli(C, "exclude no_wait " ++ Addr, 60),
        ExMs = wall() - S,
        out("  ~s: exclude ~s (~b ms): ~s", [ts(C), Addr, ExMs, oneline(Ex)]),
        Avail1 = wait_available(C, 60000),
        timer:sleep(6000),
        S2 = wall(),
        In = cli(C, "include " ++ Addr, 60),
        out("  ~s: include ~s (~b ms): ~s", [ts(C), Addr, wall() - S2, oneline(In)]),
        Avail2 = wait_available(C, 60000),
        #{
            excluded_process => I,
            exclude_ms => ExMs,
            exclude_ok => string:find(Ex, "ERROR") =:= nomatch,
            available_ms => {Avail1, Avail2},
            version_jump_s => jump(C, V1, S)
        }
    end);
fault(start_down, Ctx) ->
    %% The cluster's only process is killed before the nodes start; they
    %% start (their app's store open waits), and 5 s later the process
    %% is started again.
    cluster_cmd(Ctx, "kill", [0, "KILL"]),
    timer:sleep(500),
    out("  ~s: fdbserver 0 killed; starting the nodes on the cluster that is down", [ts(Ctx)]),
    run(Ctx, #{wait_up => false}, fun(_) -> #{} end, fun(C) ->
        timer:sleep(5000),
        R = wall(),
        cluster_cmd(C, "restart", [0]),
        out("  ~s: fdbserver 0 started", [ts(C)]),
        Avail = wait_available(C, 60000),
        Up = wait_nodes_up(C, 60000),
        out("  ~s: available after ~b ms, nodes up ~p ms after the start", [ts(C), Avail, [U - R || U <- Up]]),
        #{available_ms => Avail, nodes_up_after_start_ms => [U - R || U <- Up]}
    end);
fault(watch_limit, #{opts := #{watch_limit := Lim}} = Ctx) ->
    Env = [{"FDB_NETWORK_OPTION_KNOB", "default_max_outstanding_watches=" ++ integer_to_list(Lim)}],
    run(Ctx, #{env => Env, subscribe => true}, fun(C) ->
        out("  ~s: nodes run with at most ~b outstanding watches each; each subscribes to every job it adds", [ts(C), Lim]),
        timer:sleep(12000),
        #{watch_limit => Lim}
    end);
fault(node_kill, #{opts := #{timeout := T}} = Ctx) ->
    run(Ctx, #{}, fun(C) ->
        OsPid = node_pid(C, "n1"),
        Kill = wall(),
        _ = os:cmd("kill -9 " ++ OsPid),
        put(killed, [{"n1", Kill}]),
        out("  ~s: node n1 (OS pid ~s) killed with -9", [ts(C), OsPid]),
        timer:sleep((T + 3) * 1000),
        #{}
    end);
fault(node_stop_control, #{opts := #{timeout := T}} = Ctx) ->
    %% n1 frozen (SIGSTOP) for 3x the timeout while the cluster is
    %% healthy: its workers are reaped though their owners live, which is
    %% what live_reaped must count (worker_reaped events of a node that
    %% was not killed, worker_reinstated, the owners' reaped messages).
    run(Ctx, #{}, fun(C) ->
        OsPid = node_pid(C, "n1"),
        _ = os:cmd("kill -STOP " ++ OsPid),
        out("  ~s: node n1 (OS pid ~s) stopped (SIGSTOP) for ~b s", [ts(C), OsPid, 3 * T]),
        timer:sleep(3 * T * 1000),
        _ = os:cmd("kill -CONT " ++ OsPid),
        out("  ~s: node n1 continued", [ts(C)]),
        #{}
    end).

%% The common run: nodes up, warm-up, the fault, available again, settle,
%% then the drain and the check.
run(Ctx, NodeOpts, Inject) ->
    run(Ctx, NodeOpts, Inject, fun(_) -> #{} end).

run(#{opts := Opts, dir := Dir} = Ctx, NodeOpts, Inject, AfterStart) ->
    put(killed, []),
    Started = [start_node(Ctx, N, NodeOpts) || N <- ["n1", "n2"]],
    put(nodes, Started),
    Marks0 =
        case maps:get(wait_up, NodeOpts, true) of
            true ->
                _ = wait_nodes_up(Ctx, 60000),
                #{};
            false ->
                AfterStart(Ctx)
        end,
    out("  ~s: nodes up", [ts(Ctx)]),
    timer:sleep(maps:get(warm_ms, Opts)),
    Marks = maps:merge(Marks0, Inject(Ctx)),
    _ = wait_available(Ctx, 60000),
    timer:sleep((maps:get(timeout, Opts) + 2) * 1000),
    ok = file:write_file(filename:join(Dir, "stop_adds"), <<>>),
    timer:sleep(1500),
    out("  ~s: adds stopped; draining", [ts(Ctx)]),
    Check = check(Ctx),
    maps:merge(Marks, Check).

%% ---- drain and check ------------------------------------------------------------

check(#{dir := Dir, cf := CF, opts := Opts} = Ctx) ->
    ok = application:load(couch_workers),
    ok = application:set_env(couch_workers, store, {fdb, CF}),
    {ok, _} = application:ensure_all_started(couch_workers),
    Names = ["n1", "n2"],
    Tried = lists:usort(lists:append([tried(Dir, N) || N <- Names])),
    Drain = drain(Tried, now_ms() + maps:get(drain_s, Opts) * 1000),
    out("  ~s: drain ~p", [ts(Ctx), Drain]),
    ok = file:write_file(filename:join(Dir, "stop"), <<>>),
    wait_nodes_gone(20000),
    Jobs = maps:from_list(pmap(fun(Id) -> {Id, job(Id)} end, Tried)),
    Adds = maps:from_list(lists:append([answers(Dir, N) || N <- Names])),
    Fins = lists:append([fins(Dir, N) || N <- Names]),
    Events = lists:append([events(Dir, N) || N <- Names]),
    Killed = get(killed),
    AddRes = check_adds(Tried, Adds, Jobs),
    FinRes = check_fins(Fins, Jobs),
    Reaped = live_reaped(Events, Killed),
    Left = dead_left(Events, Killed),
    Subs = check_subs(Events, Jobs),
    NodeFailed = [N || N <- Names, failed_node(Dir, N)],
    Res = #{
        lost => maps:get(lost, AddRes),
        twice => maps:get(twice, FinRes),
        live_reaped => maps:get(live, Reaped),
        wrong_answers => maps:get(wrong, AddRes) + maps:get(wrong, FinRes),
        added_ok => maps:get(ok, AddRes),
        adds_tried => length(Tried),
        finished => maps:get(finished, AddRes),
        reruns => maps:get(reruns, AddRes),
        events => count_events(Events),
        drain_ms => maps:get(ms, Drain)
    },
    Res1 = maybe_put(add_errors, maps:get(errors, AddRes), Res),
    Res2 = maybe_put(wrong, maps:get(wrong_list, AddRes) ++ maps:get(wrong_list, FinRes), Res1),
    Res3 = maybe_put(lost_ids, lists:sublist(maps:get(lost_ids, AddRes), 10), Res2),
    Res4 = maybe_put(twice_ids, lists:sublist(maps:get(twice_ids, FinRes), 10), Res3),
    Res5 = maybe_put(fin_errors, maps:get(errors, FinRes), Res4),
    Res6 = maybe_put(reaped_detail, maps:get(detail, Reaped), Res5),
    Res7 =
        case Killed of
            [] -> Res6;
            _ -> Res6#{dead_node_left_ms => Left, dead_reaped => maps:get(dead, Reaped)}
        end,
    Res8 =
        case Subs of
            none -> Res7;
            {Subscribed, Missed} -> Res7#{subscribed => Subscribed, sub_missed => Missed}
        end,
    Res9 = maybe_put(node_failed, NodeFailed, Res8),
    Res10 = maybe_put(unanswered_adds, maps:get(unanswered, AddRes), Res9),
    maybe_put(accept_errors, count_kind(Events, "accept_error"), Res10).

maybe_put(_K, [], M) -> M;
maybe_put(_K, E, M) when E =:= #{} -> M;
maybe_put(_K, 0, M) -> M;
maybe_put(K, V, M) -> M#{K => V}.

job(Id) ->
    job(Id, 0).

job(Id, Tries) ->
    case couch_workers:job_get(?TYPE, Id) of
        {ok, #{state := S, attempts := A} = J} ->
            Fin =
                case J of
                    #{result := #{<<"fin">> := F}} -> F;
                    _ -> none
                end,
            {S, A, Fin};
        {error, not_found} ->
            not_found;
        {error, _} when Tries < 20 ->
            timer:sleep(500),
            job(Id, Tries + 1);
        {error, E} ->
            {error, E}
    end.

drain(Ids, Deadline) ->
    T0 = now_ms(),
    Left = drain_loop(Ids, Deadline),
    #{unfinished => length(Left), ms => now_ms() - T0}.

drain_loop(Ids, Deadline) ->
    Left = [Id || {Id, J} <- pmap(fun(Id) -> {Id, job(Id)} end, Ids), element(1, as_tuple(J)) =/= finished, J =/= not_found],
    case Left =:= [] orelse now_ms() > Deadline of
        true ->
            Left;
        false ->
            timer:sleep(500),
            drain_loop(Left, Deadline)
    end.

as_tuple(T) when is_tuple(T) -> T;
as_tuple(A) -> {A}.

check_adds(Tried, Adds, Jobs) ->
    lists:foldl(
        fun(Id, Acc) ->
            J = maps:get(Id, Jobs),
            Exists = J =/= not_found andalso element(1, as_tuple(J)) =/= error,
            Finished = element(1, as_tuple(J)) =:= finished,
            Answer = maps:get(Id, Adds, unanswered),
            Acc1 =
                case Answer of
                    <<"ok">> -> Acc#{ok := maps:get(ok, Acc) + 1};
                    unanswered -> Acc#{unanswered := maps:get(unanswered, Acc) + 1};
                    Err -> Acc#{errors := bump(short(Err), maps:get(errors, Acc))}
                end,
            Wrong =
                case {Answer, Exists} of
                    {<<"ok">>, false} -> [{add_ok_missing, Id}];
                    {<<"ok">>, true} -> [];
                    {unanswered, _} -> [];
                    {<<"error:commit_unknown_result">>, _} -> [];
                    {_, true} -> [{add_error_exists, Id, Answer}];
                    {_, false} -> []
                end,
            Lost = (Answer =:= <<"ok">> orelse Exists) andalso not Finished,
            Acc2 =
                case Wrong of
                    [] -> Acc1;
                    _ -> Acc1#{wrong := maps:get(wrong, Acc1) + 1, wrong_list := Wrong ++ maps:get(wrong_list, Acc1)}
                end,
            Acc3 =
                case Lost of
                    true -> Acc2#{lost := maps:get(lost, Acc2) + 1, lost_ids := [{Id, J} | maps:get(lost_ids, Acc2)]};
                    false -> Acc2
                end,
            Acc4 =
                case Finished of
                    true -> Acc3#{finished := maps:get(finished, Acc3) + 1};
                    false -> Acc3
                end,
            case J of
                {_, A, _} when A > 1 -> Acc4#{reruns := maps:get(reruns, Acc4) + 1};
                _ -> Acc4
            end
        end,
        #{ok => 0, unanswered => 0, errors => #{}, wrong => 0, wrong_list => [], lost => 0, lost_ids => [], finished => 0, reruns => 0},
        Tried
    ).

%% Fins: [{JobId, FinId, Answer}].
check_fins(Fins, Jobs) ->
    ByJob = lists:foldl(fun({J, F, A}, M) -> maps:update_with(J, fun(L) -> [{F, A} | L] end, [{F, A}], M) end, #{}, Fins),
    Errors = lists:foldl(fun({_, _, A}, M) when A =/= <<"ok">> -> bump(short(A), M); (_, M) -> M end, #{}, Fins),
    maps:fold(
        fun(JobId, Calls, Acc) ->
            Stored =
                case maps:get(JobId, Jobs, not_found) of
                    {finished, _, F} -> F;
                    _ -> none
                end,
            Oks = [F || {F, <<"ok">>} <- Calls],
            NotStuck = [F || F <- Oks, F =/= Stored],
            Twice = length(Oks) > 1 orelse (NotStuck =/= [] andalso Stored =/= none),
            StoredAnswer = proplists:get_value(Stored, Calls, unlogged),
            Wrong =
                case {Stored, StoredAnswer} of
                    {none, _} when Oks =/= [] -> [{fin_ok_not_finished, JobId}];
                    {none, _} -> [];
                    {_, <<"ok">>} -> [];
                    {_, unlogged} -> [];
                    {_, <<"error:commit_unknown_result">>} -> [];
                    {_, Other} -> [{fin_error_landed, JobId, Other}]
                end,
            Acc1 =
                case Twice of
                    true -> Acc#{twice := maps:get(twice, Acc) + 1, twice_ids := [JobId | maps:get(twice_ids, Acc)]};
                    false -> Acc
                end,
            case Wrong of
                [] -> Acc1;
                _ -> Acc1#{wrong := maps:get(wrong, Acc1) + 1, wrong_list := Wrong ++ maps:get(wrong_list, Acc1)}
            end
        end,
        #{twice => 0, twice_ids => [], wrong => 0, wrong_list => [], errors => Errors},
        ByJob
    ).

%% Events: [{Node, Ms, Kind, Rest}].
live_reaped(Events, Killed) ->
    KilledNames = [N || {N, _} <- Killed],
    Dead = fun(Id) -> lists:any(fun(N) -> lists:prefix(N ++ "-", binary_to_list(Id)) end, KilledNames) end,
    Detail = lists:foldl(
        fun
            ({_, _, "reaped_msg", [Id | _]}, Acc) -> [{reaped_msg, Id} | Acc];
            ({_, _, "lost_msg", [Id | _]}, Acc) -> [{lost_msg, Id} | Acc];
            ({_, _, "event", [W, Id | _]}, Acc) when W =:= <<"worker_reinstated">>; W =:= <<"worker_superseded">> ->
                [{binary_to_atom(W), Id} | Acc];
            ({_, _, "event", [<<"worker_reaped">>, Id | _]}, Acc) ->
                case Dead(Id) of
                    true -> Acc;
                    false -> [{worker_reaped, Id} | Acc]
                end;
            (_, Acc) ->
                Acc
        end,
        [],
        Events
    ),
    DeadReaped = length([x || {_, _, "event", [<<"worker_reaped">>, Id | _]} <- Events, Dead(Id)]),
    #{live => length(Detail), detail => lists:reverse(Detail), dead => DeadReaped}.

dead_left(_Events, []) ->
    undefined;
dead_left(Events, [{Name, KillMs}]) ->
    Prefix = list_to_binary(Name ++ "-"),
    Deliveries = lists:sort([
        {Ms, Ids}
     || {N, Ms, "membership", Rest} <- Events, N =/= Name, Ms >= KillMs, Ids <- [membership_ids(Rest)]
    ]),
    case [Ms || {Ms, Ids} <- Deliveries, not lists:any(fun(Id) -> binary:longest_common_prefix([Id, Prefix]) =:= byte_size(Prefix) end, Ids)] of
        [First | _] -> First - KillMs;
        [] -> never
    end.

membership_ids([]) -> [];
membership_ids([B | _]) -> binary:split(B, <<",">>, [global, trim_all]).

check_subs(Events, Jobs) ->
    Subs = [{Id, S} || {_, _, "sub", [Id, S | _]} <- Events],
    case Subs of
        [] ->
            none;
        _ ->
            Ids = lists:usort([Id || {Id, _} <- Subs]),
            Fin = sets:from_list([Id || {Id, <<"finished">>} <- Subs]),
            Missed = [Id || Id <- Ids, not sets:is_element(Id, Fin), element(1, as_tuple(maps:get(Id, Jobs, not_found))) =:= finished],
            {length(Ids), length(Missed)}
    end.

count_events(Events) ->
    maps:to_list(lists:foldl(fun({_, _, "event", [W | _]}, M) -> bump(binary_to_atom(W), M); (_, M) -> M end, #{}, Events)).

count_kind(Events, Kind) ->
    length([x || {_, _, K, _} <- Events, K =:= Kind]).

bump(K, M) -> maps:update_with(K, fun(V) -> V + 1 end, 1, M).

short(<<"error:", R/binary>>) -> binary_to_atom(hd(binary:split(R, <<" ">>)));
short(B) -> binary_to_atom(B).

failed_node(Dir, N) ->
    Evs = events(Dir, N),
    lists:any(fun({_, _, K, _}) -> K =:= "app_start_failed" orelse K =:= "crash" end, Evs).

%% ---- the logs ------------------------------------------------------------------------

lines(File) ->
    case file:read_file(File) of
        {ok, Bin} -> lists:droplast(binary:split(Bin, <<"\n">>, [global]));
        {error, enoent} -> []
    end.

words(L) -> binary:split(L, <<" ">>, [global, trim_all]).

tried(Dir, N) ->
    [Id || L <- lines(filename:join(Dir, N ++ ".adds")), [<<"try">>, Id] <- [words(L)]].

answers(Dir, N) ->
    [{Id, A} || L <- lines(filename:join(Dir, N ++ ".adds")), [<<"add">>, Id, A, _] <- [words(L)]].

fins(Dir, N) ->
    [{J, F, A} || L <- lines(filename:join(Dir, N ++ ".fins")), [<<"fin">>, J, F, A, _] <- [words(L)]].

events(Dir, N) ->
    [
        {N, binary_to_integer(Ms), binary_to_list(K), Rest}
     || L <- lines(filename:join(Dir, N ++ ".events")), [Ms, K | Rest] <- [words(L)]
    ].

%% ---- nodes -----------------------------------------------------------------------------

start_node(#{dir := Dir, cf := CF, opts := Opts}, Name, NodeOpts) ->
    Erl = os:find_executable("erl"),
    Ebins = [P || P <- code:get_path(), not lists:prefix(code:lib_dir(), P), P =/= "."],
    Cfg = #{
        dir => Dir,
        name => Name,
        workers => maps:get(workers, Opts),
        timeout => maps:get(timeout, Opts),
        add_ms => maps:get(add_ms, Opts),
        cluster_file => CF,
        subscribe => maps:get(subscribe, NodeOpts, false)
    },
    Eval = lists:flatten(io_lib:format("cw_faults_node:node_main(~w).", [maps:to_list(Cfg)])),
    Out = filename:join(Dir, Name ++ ".out"),
    _ = file:delete(filename:join(Dir, Name ++ ".pid")),
    Args = lists:append([["-pa", P] || P <- Ebins]) ++ ["-noshell", "-noinput", "-eval", Eval],
    Port = open_port({spawn_executable, "/bin/sh"}, [
        {args, ["-c", "exec \"$0\" \"$@\" >>'" ++ Out ++ "' 2>&1", Erl | Args]},
        {env, maps:get(env, NodeOpts, [])},
        exit_status
    ]),
    {os_pid, OsPid} = erlang:port_info(Port, os_pid),
    {Name, integer_to_list(OsPid)}.

%% Waits for every node's pid file (written once its app and workers
%% run); returns the wall times at which each was seen.
wait_nodes_up(#{dir := Dir}, Timeout) ->
    Deadline = now_ms() + Timeout,
    [wait_file(filename:join(Dir, N ++ ".pid"), Deadline) || {N, _} <- get(nodes)].

wait_file(F, Deadline) ->
    case filelib:is_file(F) of
        true ->
            wall();
        false ->
            case now_ms() > Deadline of
                true -> error({node_not_up, F});
                false -> timer:sleep(50), wait_file(F, Deadline)
            end
    end.

node_pid(_Ctx, Name) ->
    {Name, P} = lists:keyfind(Name, 1, get(nodes)),
    P.

wait_nodes_gone(Timeout) ->
    Deadline = now_ms() + Timeout,
    [wait_gone(P, Deadline) || {_, P} <- nodes_list()],
    ok.

nodes_list() ->
    case get(nodes) of
        undefined -> [];
        L -> L
    end.

wait_gone(P, Deadline) ->
    case alive(P) andalso now_ms() < Deadline of
        true -> timer:sleep(20), wait_gone(P, Deadline);
        false -> ok
    end.

alive(P) ->
    case file:read_file("/proc/" ++ P ++ "/stat") of
        {ok, Stat} ->
            [_, Rest] = string:split(Stat, ")", trailing),
            R = string:trim(Rest, leading),
            R =/= <<>> andalso binary:first(R) =/= $Z;
        {error, _} ->
            false
    end.

kill_nodes(Dir) ->
    _ = file:write_file(filename:join(Dir, "stop"), <<>>),
    wait_nodes_gone(5000),
    [os:cmd("kill -9 " ++ P ++ " 2>/dev/null") || {_, P} <- nodes_list(), alive(P)],
    ok.

%% ---- the cluster -----------------------------------------------------------------------

cluster_sh(#{root := Root}) -> filename:join([Root, "scripts", "fdb-cluster.sh"]).

cluster_start(Opts, Procs) ->
    Out = os:cmd(cluster_sh(Opts) ++ " start --procs " ++ integer_to_list(Procs) ++ " 2>&1"),
    Vars = [list_to_tuple(string:split(L, "=")) || L <- string:split(Out, "\n", all), string:find(L, "=") =/= nomatch],
    case {lists:keyfind("FDB_CLUSTER_FILE", 1, Vars), lists:keyfind("FDB_CLUSTER_DIR", 1, Vars)} of
        {{_, CF}, {_, CDir}} -> {CF, CDir};
        _ -> error({cluster_start_failed, Out})
    end.

cluster_stop(Opts, CDir) ->
    _ = os:cmd(cluster_sh(Opts) ++ " stop " ++ CDir),
    ok.

cluster_cmd(#{opts := Opts, cdir := CDir}, Cmd, Args) ->
    A = lists:join(" ", [io_lib:format("~s", [to_list(X)]) || X <- Args]),
    Out = os:cmd(lists:flatten([cluster_sh(Opts), " ", Cmd, " ", CDir, " ", A, " 2>&1"])),
    case Out of
        "" -> ok;
        _ -> out("  fdb-cluster.sh ~s: ~s", [Cmd, Out])
    end.

to_list(I) when is_integer(I) -> integer_to_list(I);
to_list(S) -> S.

port(#{cdir := CDir}, I) ->
    {ok, B} = file:read_file(filename:join(CDir, "port." ++ integer_to_list(I))),
    binary_to_list(string:trim(B)).

cli(#{opts := #{fdb_cli := Cli}, cf := CF}, Cmd, TimeoutS) ->
    os:cmd(lists:flatten(io_lib:format("'~s' -C '~s' --timeout ~b --exec '~s' 2>&1", [Cli, CF, TimeoutS, Cmd]))).

%% Waits until fdbcli says the database is available; the ms it took.
wait_available(C, Timeout) ->
    T0 = now_ms(),
    wait_available(C, T0, T0 + Timeout).

wait_available(C, T0, Deadline) ->
    case string:find(cli(C, "status minimal", 5), "The database is available") of
        nomatch when T0 < Deadline ->
            timer:sleep(200),
            case now_ms() > Deadline of
                true -> error(cluster_not_available);
                false -> wait_available(C, T0, Deadline)
            end;
        _ ->
            now_ms() - T0
    end.

%% The cluster's read version (fdbcli getversion), or undefined.
version(C) ->
    Out = cli(C, "getversion", 10),
    case string:to_integer(string:trim(lists:last(string:split(string:trim(Out), "\n", all)))) of
        {V, _} when is_integer(V) -> V;
        _ -> undefined
    end.

%% How far the versions moved beyond the wall clock since V1 (at Wall1),
%% in seconds (FoundationDB: about 1,000,000 versions a second).
jump(C, V1, Wall1) ->
    V2 = version(C),
    case is_integer(V1) andalso is_integer(V2) of
        true -> round(((V2 - V1) / 1.0e6 - (wall() - Wall1) / 1000) * 10) / 10;
        false -> undefined
    end.

%% The cluster's processes and their roles, from fdbcli's status json:
%% [{I, Roles}] (I 0-based, as fdb-cluster.sh numbers them).
roles(C) ->
    Json = cli(C, "status json", 10),
    File = filename:join(maps:get(dir, C), "status.json"),
    ok = file:write_file(File, Json),
    Py =
        "import json,sys\n"
        "s=json.load(open(sys.argv[1]))\n"
        "for p in s['cluster']['processes'].values():\n"
        "  print(p['address'].split(':')[1], ','.join(x['role'] for x in p.get('roles',[])) or '-')\n",
    PyFile = filename:join(maps:get(dir, C), "roles.py"),
    ok = file:write_file(PyFile, Py),
    Out = string:trim(os:cmd("python3 " ++ PyFile ++ " " ++ File)),
    Ports = [{port(C, I), I} || I <- lists:seq(0, maps:get(procs, C) - 1)],
    R = lists:sort([
        {I, string:split(Roles, ",", all)}
     || L <- string:split(Out, "\n", all), [PortS, Roles] <- [string:split(L, " ")], {_, I} <- [lists:keyfind(PortS, 1, Ports)]
    ]),
    [out("  ~s: process ~b: ~s", [ts(C), I, lists:join(",", Rs)]) || {I, Rs} <- R],
    R.

recover(C, I, What) ->
    V1 = version(C),
    Kill = wall(),
    cluster_cmd(C, "kill", [I, "KILL"]),
    out("  ~s: killed fdbserver ~b (~s) with -9", [ts(C), I, What]),
    Avail = wait_available(C, 60000),
    Jump = jump(C, V1, Kill),
    out("  ~s: available ~b ms after the kill; version jump ~p s", [ts(C), Avail, Jump]),
    timer:sleep(3000),
    cluster_cmd(C, "restart", [I]),
    out("  ~s: fdbserver ~b restarted", [ts(C), I]),
    {I, Avail, Jump}.

%% The process to kill for a recovery: the one holding the cluster
%% controller and the master if one holds both, else the master's.
cc_process(C) ->
    R = roles(C),
    Has = fun(Role) -> [I || {I, Rs} <- R, lists:member(Role, Rs)] end,
    case [I || I <- Has("master"), lists:member(I, Has("cluster_controller"))] of
        [I | _] ->
            I;
        [] ->
            [I | _] = Has("master"),
            out("  ~s: the cluster controller is on another process than the master", [ts(C)]),
            I
    end.

%% The process to exclude: one with a transaction log (its exclusion
%% moves the logs: a recovery) that does not hold the master, else any
%% other than the master's.
exclude_process(C) ->
    R = roles(C),
    NotMaster = [{I, Rs} || {I, Rs} <- R, not lists:member("master", Rs)],
    case [I || {I, Rs} <- NotMaster, lists:member("log", Rs)] of
        [I | _] -> I;
        [] -> element(1, hd(NotMaster))
    end.

%% ---- helpers ------------------------------------------------------------------------

oneline(S) -> string:trim(lists:flatten(string:replace(S, "\n", " | ", all))).

ts(#{t0 := T0}) -> io_lib:format("~.1f s", [(now_ms() - T0) / 1000]).

now_ms() -> erlang:monotonic_time(millisecond).

wall() -> os:system_time(millisecond).

out(Fmt, Args) -> io:format(Fmt ++ "~n", Args).

pmap(F, L) ->
    Self = self(),
    Chunks = chunks(L, 8),
    Refs = [
        begin
            R = make_ref(),
            spawn_link(fun() -> Self ! {R, [F(X) || X <- C]} end),
            R
        end
     || C <- Chunks
    ],
    lists:append([receive {R, Res} -> Res end || R <- Refs]).

chunks([], _) -> [];
chunks(L, N) ->
    Size = max(1, (length(L) + N - 1) div N),
    chunks_of(L, Size).

chunks_of([], _) -> [];
chunks_of(L, Size) when length(L) =< Size -> [L];
chunks_of(L, Size) ->
    {H, T} = lists:split(Size, L),
    [H | chunks_of(T, Size)].
