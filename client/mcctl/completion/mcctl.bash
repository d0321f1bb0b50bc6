# bash completion for mcctl (installed as
# share/bash-completion/completions/mcctl by CMake and mooncake-tools).
_mcctl() {
  local cur prev words cword
  if declare -F _init_completion >/dev/null 2>&1; then
    _init_completion -n = || return
  else
    COMPREPLY=()
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  fi

  local commands="status gpus nics topo sessions groups qps mrs peers watch doctor selftest help"
  local options="--socket --timeout-ms --json -j --version --help"

  case $prev in
    --socket)
      COMPREPLY=($(compgen -f -- "$cur"))
      return ;;
    --root)
      COMPREPLY=($(compgen -d -- "$cur"))
      return ;;
    --timeout-ms | --count | --across)
      return ;;
    --rank)
      COMPREPLY=($(compgen -W "0 1" -- "$cur"))
      return ;;
    --nic)
      # The NICs the daemon lists (quietly nothing when it is down).
      local nics
      nics=$(mcctl nics --json 2>/dev/null | sed -n 's/^    "name": "\(.*\)",$/\1/p')
      COMPREPLY=($(compgen -W "$nics" -- "$cur"))
      return ;;
  esac

  # The command given so far, if any.
  local i cmd=""
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      --socket | --timeout-ms | --root | --count | --nic | --gpu | --across | --rank) ((i++)) ;;
      -*) ;;
      *) cmd=${words[i]}; break ;;
    esac
  done

  case $cmd in
    "")
      if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
      else
        COMPREPLY=($(compgen -W "$commands" -- "$cur"))
      fi ;;
    watch)
      COMPREPLY=($(compgen -W "--count --json -j" -- "$cur")) ;;
    doctor)
      COMPREPLY=($(compgen -W "--root --json -j" -- "$cur")) ;;
    selftest)
      if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--nic --gpu --across --rank --json -j" -- "$cur"))
      else
        COMPREPLY=($(compgen -W "rdma" -- "$cur"))
      fi ;;
    groups)
      if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--json -j" -- "$cur"))
      else
        # Group names the daemon shows this user (quietly nothing when it is down).
        local names
        names=$(mcctl groups --json 2>/dev/null |
          sed -n 's/^    "name": "\(.*\)",$/\1/p')
        COMPREPLY=($(compgen -W "$names" -- "$cur"))
      fi ;;
    *)
      COMPREPLY=($(compgen -W "--json -j" -- "$cur")) ;;
  esac
}
complete -F _mcctl mcctl
