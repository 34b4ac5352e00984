%% @doc The worker nodes of the soak run (cw_soak, the controller, says
%% what is checked): starting one as its own `erl' OS process, waiting for
%% it to be gone after a kill, stopping them all; and what runs in one
%% (node_main/1): the app on the shared store and its worker processes,
%% each logging the jobs it finished.
-module(cw_soak_node).

-export([start_node/4, node_os_pid/1, node_alive/1, wait_gone/2, stop_nodes/1, node_main/1]).

-spec start_node(pos_integer(), pos_integer(), file:filename(), map()) -> map().
-spec node_os_pid(map()) -> string().
-spec node_alive(map()) -> boolean().
-spec wait_gone(string(), non_neg_integer()) -> ok.
-spec stop_nodes(file:filename()) -> ok.
-spec node_main([{atom(), term()}]) -> no_return().

-import(cw_soak, [now_ms/0]).

%% The job and worker type of the run, as cw_soak's.
-define(TYPE, <<"soak">>).

start_node(I, Inc, Dir, Opts) ->
    Erl = os:find_executable("erl"),
    Ebins = [P || P <- code:get_path(), not lists:prefix(code:lib_dir(), P), P =/= "."],
    Cfg = Opts#{node => I, inc => Inc, dir => Dir},
    Eval = lists:flatten(io_lib:format("cw_soak_node:node_main(~w).", [maps:to_list(Cfg)])),
    Out = filename:join(Dir, io_lib:format("n~b.out", [I])),
    PidFile = pid_file(Dir, I),
    _ = file:delete(PidFile),
    Args = lists:append([["-pa", P] || P <- Ebins]) ++ ["-noshell", "-noinput", "-eval", Eval],
    %% sh execs erl (which execs the emulator): one OS process, its
    %% output appended to nI.out.
    Port = open_port({spawn_executable, "/bin/sh"}, [
        {args, ["-c", "exec \"$0\" \"$@\" >>'" ++ Out ++ "' 2>&1", Erl | Args]},
        exit_status
    ]),
    {os_pid, PortPid} = erlang:port_info(Port, os_pid),
    %% The node writes its pid once its app and workers run.
    OsPid = wait_pid_file(PidFile, now_ms() + 30000),
    #{port => Port, os_pid => OsPid, port_os_pid => PortPid, inc => Inc, node => I}.

pid_file(Dir, I) ->
    filename:join(Dir, io_lib:format("n~b.pid", [I])).

wait_pid_file(File, Deadline) ->
    case file:read_file(File) of
        {ok, Bin} when byte_size(Bin) > 0 ->
            binary_to_list(string:trim(Bin));
        _ ->
            case now_ms() > Deadline of
                true ->
                    error({node_did_not_start, File});
                false ->
                    timer:sleep(50),
                    wait_pid_file(File, Deadline)
            end
    end.

node_os_pid(#{os_pid := OsPid}) -> OsPid.

%% Whether the node's OS process runs (not killed, not exited).
node_alive(#{os_pid := OsPid}) -> os_pid_alive(OsPid).

wait_gone(OsPid, Timeout) ->
    Deadline = now_ms() + Timeout,
    wait_gone_loop(OsPid, Deadline).

wait_gone_loop(OsPid, Deadline) ->
    case os_pid_alive(OsPid) andalso now_ms() < Deadline of
        true ->
            timer:sleep(10),
            wait_gone_loop(OsPid, Deadline);
        false ->
            ok
    end.

os_pid_alive(OsPid) ->
    case file:read_file("/proc/" ++ OsPid ++ "/stat") of
        {ok, Stat} ->
            [_, Rest] = string:split(Stat, ")", trailing),
            R = string:trim(Rest, leading),
            R =/= <<>> andalso binary:first(R) =/= $Z;
        {error, _} ->
            false
    end.

stop_nodes(Dir) ->
    ok = file:write_file(filename:join(Dir, "stop"), <<>>),
    Nodes = get(nodes),
    Deadline = now_ms() + 30000,
    [wait_gone_loop(OsPid, Deadline) || #{os_pid := OsPid} <- maps:values(Nodes)],
    %% (Whatever kill says: a node that left already is no error.)
    _ = [os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null") || #{os_pid := OsPid} <- maps:values(Nodes)],
    ok.

%% Runs on a worker node: the app on the shared store, `workers' worker
%% processes, until the stop file appears (or a kill -9).
node_main(CfgList) ->
    Cfg = maps:from_list(CfgList),
    #{dir := Dir, node := I, inc := Inc, workers := W} = Cfg,
    %% A worker that crashes ends the node (a node without workers would
    %% only look alive).
    process_flag(trap_exit, true),
    ok = application:load(couch_workers),
    ok = logger:set_primary_config(level, warning),
    ok = application:set_env(couch_workers, store, {embedded, filename:join(Dir, "store")}),
    {ok, _} = application:ensure_all_started(couch_workers),
    Node = iolist_to_binary(io_lib:format("n~b", [I])),
    Workers = [spawn_link(fun() -> worker(Cfg, Node, Inc, Slot) end) || Slot <- lists:seq(1, W)],
    ok = file:write_file(pid_file(Dir, I), os:getpid()),
    io:format("~s incarnation ~b: ~b workers (OS pid ~s)~n", [Node, Inc, length(Workers), os:getpid()]),
    wait_stop(Dir, Workers).

wait_stop(Dir, Workers) ->
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
            _ = application:stop(couch_workers),
            halt(0);
        false ->
            receive
                {'EXIT', Pid, Reason} when Reason =/= normal ->
                    io:format("worker ~p crashed: ~p~n", [Pid, Reason]),
                    halt(3)
            after 500 ->
                wait_stop(Dir, Workers)
            end
    end.

worker(#{dir := Dir, timeout := Timeout} = Cfg, Node, Inc, Slot) ->
    Id = iolist_to_binary(io_lib:format("~s-w~b", [Node, Slot])),
    %% `node' and `inc' tell the controller's stuck check which
    %% incarnation a registration belongs to.
    Ref = register_worker(Id, #{timeout => Timeout, node => Node, inc => Inc}, 0),
    Log = filename:join([Dir, "logs", io_lib:format("~s-i~b-w~b.log", [Node, Inc, Slot])]),
    {ok, Fd} = file:open(Log, [append, raw, binary]),
    work(Cfg, Ref, Fd, {Node, Inc, Slot}).

%% A registration that timed out (the store stalled: on the embedded
%% store it did not commit) is tried again, as a real worker would; any
%% other answer ends the node (the controller counts its exit).
register_worker(Id, Opts, Tries) ->
    case couch_workers:worker_register(?TYPE, Id, Opts, self()) of
        Ref when is_reference(Ref) ->
            Ref;
        {error, timeout} when Tries < 100 ->
            timer:sleep(200),
            register_worker(Id, Opts, Tries + 1);
        Other ->
            error({worker_register, Id, Other})
    end.

work(#{batch := B} = Cfg, Ref, Fd, Me) ->
    receive
        stop ->
            %% The finish log is the check's evidence: a failed close is
            %% not ignored.
            ok = file:close(Fd),
            ok = couch_workers:worker_unregister(Ref)
    after 0 ->
        Jobs = take(Ref, B, []),
        [finish(H, Fd, Me) || H <- Jobs],
        work(Cfg, Ref, Fd, Me)
    end.

%% Up to B jobs: at once while there are some, else one wait (1 s).
take(_Ref, 0, Acc) ->
    lists:reverse(Acc);
take(Ref, B, Acc) ->
    Timeout =
        case Acc of
            [] -> 1000;
            _ -> 0
        end,
    case couch_workers:job_accept(Ref, #{timeout => Timeout}) of
        {ok, H} -> take(Ref, B - 1, [H | Acc]);
        {error, _} -> lists:reverse(Acc)
    end.

finish(H, Fd, Me) ->
    finish(H, Fd, Me, 0).

%% A finish that timed out (the store stalled) is tried again, as a real
%% worker would: on the embedded store a timed-out write did not commit.
finish(#{id := Id, attempts := A} = H, Fd, {Node, Inc, Slot} = Me, Tries) ->
    Result = #{<<"node">> => Node, <<"inc">> => Inc, <<"slot">> => Slot},
    case couch_workers:job_finish(H, Result) of
        {error, timeout} when Tries < 20 ->
            timer:sleep(200),
            finish(H, Fd, Me, Tries + 1);
        ok ->
            ok = file:write(Fd, [Id, $\s, Node, $\s, integer_to_binary(Inc), $\s, integer_to_binary(Slot), $\s, integer_to_binary(A), $\n]);
        {error, not_owner} ->
            ok = file:write(Fd, [<<"not_owner ">>, Id, $\s, Node, $\s, integer_to_binary(Slot), $\s, integer_to_binary(A), $\n]);
        {error, _} ->
            %% Held and given up: the stuck check counts this accept as run.
            ok = file:write(Fd, [<<"failed ">>, Id, $\s, Node, $\s, integer_to_binary(Slot), $\s, integer_to_binary(A), $\n])
    end.
